"""Loading a GGUF model into llama.cpp, creating its context, and the vocabulary.

`LlamaModel` owns `llama_model*` (weights and vocabulary; read-only, so
tokenization may run on any thread) and `LlamaContext` owns `llama_context*`
(KV cache and compute buffers; used only by the engine thread). Both free their
native memory exactly once in `close()`.

llama.cpp writes its own log to stderr; it is routed to the `edge.llama` logger
instead, so `edge` output stays clean unless `--verbose` is given.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edge.contracts.options import DEFAULT_N_BATCH, DEFAULT_SLOTS
from edge.errors import ModelLoadError
from edge.kvcache import KV_CACHE_TYPES
from edge.runtime.llama import llama_cpp
from edge.runtime.llama.backend import EXTRA_BUFFERS_ENV, probe_backends
from edge.runtime.llama.loadlog import (
    BUFFER_LINE,
    MAPPED,
    Backend,
    ensure_backend,
    known_buffers,
    load_log,
    quiet_log,
)

log = logging.getLogger("edge.llama")

KV_TYPES: dict[str, int] = {name: getattr(llama_cpp, f"GGML_TYPE_{name.upper()}") for name in KV_CACHE_TYPES}


@dataclass(frozen=True)
class ContextConfig:
    n_ctx: int
    n_batch: int = DEFAULT_N_BATCH
    n_ubatch: int = DEFAULT_N_BATCH
    n_seq_max: int = DEFAULT_SLOTS
    n_threads: int = 4
    n_threads_batch: int | None = None
    kv_type: str = "f16"
    flash_attn: bool | None = None  # None: llama.cpp decides (auto)
    swa_full: bool = False  # full-size sliding-window cache: memory for simpler prefix reuse
    kv_unified: bool = True  # one pool of n_ctx cells; False: n_seq_max streams of n_ctx / n_seq_max
    # logits rows one batch may request; the engine asks for at most one per sequence, and the
    # logits buffer is n_outputs_max x n_vocab floats (512 MiB for a 262k vocabulary at 512)
    n_outputs_max: int | None = None  # None: n_seq_max
    embeddings: bool = False  # an embeddings context (runtime/embed/): pooled vectors, no logits
    pooling: int | None = None  # llama_pooling_type for it (None: the model's own)


def load_mode_for(use_mmap: bool | None) -> int:
    """The llama_load_mode for a use_mmap choice (None: llama.cpp's AUTO)."""
    if use_mmap is None:
        return int(llama_cpp.LLAMA_LOAD_MODE_AUTO)
    return int(llama_cpp.LLAMA_LOAD_MODE_MMAP if use_mmap else llama_cpp.LLAMA_LOAD_MODE_NONE)


def file_identity(path: str) -> tuple[int, int, int, int]:
    """Device, inode, size and mtime: what tells a model file from its replacement."""
    st = os.stat(path)
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def extra_buffers() -> bool:
    """The installed build's verdict from probe_backends() (logged once when off)."""
    on = probe_backends().cpu_extra_buffers
    if not on and not Backend.warned_extra:
        Backend.warned_extra = True
        log.info("ggml extra CPU buffer types (AMX, repack) off: weights stay mapped from the file "
                 "(backend.extra_buffers_default says why); set %s=1 to try them", EXTRA_BUFFERS_ENV)
    return on


class LlamaModel:
    """Weights + vocabulary. Thread-safe for tokenization and piece lookup."""

    def __init__(
        self,
        path: str | Path,
        *,
        n_gpu_layers: int = 0,
        use_mmap: bool | None = None,
        vocab_only: bool = False,
        quiet: bool | None = None,
    ) -> None:
        """`use_mmap`: None lets llama.cpp choose (LLAMA_LOAD_MODE_AUTO), True maps the file
        (pages shared with the page cache, loaded lazily), False reads it into private memory.
        llama.cpp >= 0.3.36 replaced the `use_mmap` flag by `load_mode`. `vocab_only` loads just
        the vocabulary and metadata (a few MiB): tokenization while the weights are unloaded.
        `quiet`: None (default) keeps llama.cpp's log of the load from Python where nothing edge
        reads is in it (loadlog.py: the load then runs without the GIL); False keeps it."""
        ensure_backend()
        self.path = str(path)
        self.vocab_only = vocab_only
        if not os.path.isfile(self.path):
            raise ModelLoadError(self.path, "no such file")
        self.file_id = file_identity(self.path)
        params = llama_cpp.llama_model_default_params()
        params.n_gpu_layers = n_gpu_layers
        params.load_mode = load_mode_for(use_mmap)
        params.vocab_only = vocab_only
        params.use_extra_bufts = extra_buffers()
        known = known_buffers(probe_backends().gpu_offload, bool(params.use_extra_bufts),
                              use_mmap is not False, vocab_only)
        with load_log(quiet=known is not None and quiet is not False) as lines:
            ptr = llama_cpp.llama_model_load_from_file(self.path.encode(), params)
        # where the weights live, by llama.cpp's account ("load_tensors: CPU_Mapped model buffer
        # size = ") or, for a quiet load, as that account would read (loadlog.known_buffers)
        self.weight_buffers = (known or ()) if lines is None else tuple(
            m.group(1) for m in map(BUFFER_LINE.search, lines) if m)
        if not ptr:
            raise ModelLoadError(self.path, "llama.cpp could not load the file (run with -v for its log)")
        self.ptr: Any = ptr
        self.vocab: Any = llama_cpp.llama_model_get_vocab(ptr)
        self.n_vocab: int = llama_cpp.llama_vocab_n_tokens(self.vocab)
        self.n_ctx_train: int = llama_cpp.llama_model_n_ctx_train(ptr)
        self.n_swa: int = llama_cpp.llama_model_n_swa(ptr)
        self.bos_id: int = llama_cpp.llama_vocab_bos(self.vocab)
        self.eos_id: int = llama_cpp.llama_vocab_eos(self.vocab)
        self.add_bos: bool = bool(llama_cpp.llama_vocab_get_add_bos(self.vocab))
        self._pieces: dict[int, bytes] = {}
        self._eog: dict[int, bool] = {}
        self._piece_buf = ctypes.create_string_buffer(256)
        self._lock = threading.Lock()
        self._closed = False
        self.bos_text = self.token_text(self.bos_id) if self.bos_id >= 0 else ""

    @property
    def name(self) -> str:
        return Path(self.path).stem

    def same_file(self) -> bool:
        """The file at `path` is still the one loaded (not moved, replaced or rewritten since)."""
        try:
            return file_identity(self.path) == self.file_id
        except OSError:
            return False

    @property
    def weights_mapped(self) -> bool:
        """Every weight is computed straight from the file mapping (no repacked or GPU copy): an
        unload can give its pages back to the page cache and keep the model (pages.py)."""
        return self.weight_buffers == MAPPED

    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(1 << 16)
        n = llama_cpp.llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        if n < 0:
            return None
        if n >= len(buf):
            buf = ctypes.create_string_buffer(n + 1)
            llama_cpp.llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", "replace")

    def chat_template(self) -> str | None:
        raw = llama_cpp.llama_model_chat_template(self.ptr, None)
        return raw.decode("utf-8", "replace") if raw else None

    def token_text(self, token: int) -> str:
        """The special-token text (e.g. '<s>') for template variables."""
        if token < 0:
            return ""
        return self.piece(token, special=True).decode("utf-8", "replace")

    def tokenize(self, text: str, add_bos: bool = True, parse_special: bool = True) -> list[int]:
        if add_bos and self.bos_text and text.startswith(self.bos_text):
            add_bos = False  # the text (e.g. a rendered chat template) already carries BOS
        data = text.encode("utf-8")
        n_max = len(data) + 8
        buf = (llama_cpp.llama_token * n_max)()
        n = llama_cpp.llama_tokenize(self.vocab, data, len(data), buf, n_max, add_bos, parse_special)
        if n < 0:
            n_max = -n
            buf = (llama_cpp.llama_token * n_max)()
            n = llama_cpp.llama_tokenize(self.vocab, data, len(data), buf, n_max, add_bos, parse_special)
        toks = list(buf[:n])
        # a template that already wrote BOS text plus add_bos would give two BOS tokens
        if len(toks) >= 2 and toks[0] == toks[1] == self.bos_id and self.bos_id >= 0:
            del toks[0]
        return toks

    def piece(self, token: int, special: bool = False) -> bytes:
        """Bytes of one token (cached; control tokens render empty unless `special`)."""
        if not special:
            cached = self._pieces.get(token)
            if cached is not None:
                return cached
        with self._lock:
            buf = self._piece_buf
            n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
            out = buf.raw[:n]
        if not special:
            self._pieces[token] = out
        return out

    def detokenize(self, tokens: list[int]) -> str:
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", "replace")

    def is_eog(self, token: int) -> bool:
        v = self._eog.get(token)
        if v is None:
            v = bool(llama_cpp.llama_vocab_is_eog(self.vocab, token))
            self._eog[token] = v
        return v

    def eog_tokens(self) -> tuple[int, ...]:
        """Every end-of-generation token id (scans the vocabulary once: used by the benchmark)."""
        return tuple(t for t in range(self.n_vocab) if llama_cpp.llama_vocab_is_eog(self.vocab, t))

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            llama_cpp.llama_model_free(self.ptr)


class LlamaContext:
    """One llama_context (KV cache + compute buffers). Only the engine thread uses it."""

    def __init__(self, model: LlamaModel, cfg: ContextConfig) -> None:
        p = llama_cpp.llama_context_default_params()
        p.n_ctx = cfg.n_ctx
        p.n_batch = cfg.n_batch
        p.n_ubatch = min(cfg.n_ubatch, cfg.n_batch)
        p.n_seq_max = cfg.n_seq_max
        p.n_outputs_max = cfg.n_outputs_max or cfg.n_seq_max
        p.n_threads = cfg.n_threads
        p.n_threads_batch = cfg.n_threads_batch or cfg.n_threads
        p.kv_unified = cfg.kv_unified
        p.swa_full = cfg.swa_full
        p.embeddings = cfg.embeddings
        if cfg.pooling is not None:
            p.pooling_type = cfg.pooling
        p.no_perf = True
        if cfg.kv_type not in KV_TYPES:
            known = ", ".join(sorted(KV_TYPES))
            raise ModelLoadError(model.path, f"unknown kv_type {cfg.kv_type!r}; use one of {known}")
        p.type_k = KV_TYPES[cfg.kv_type]
        p.type_v = KV_TYPES[cfg.kv_type]
        if cfg.flash_attn is not None:
            on, off = llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED, llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
            p.flash_attn_type = on if cfg.flash_attn else off
        elif cfg.kv_type != "f16":  # a quantized V cache needs flash attention
            p.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
        with quiet_log():  # ~1,000 log lines edge reads nothing from (loadlog.py)
            ptr = llama_cpp.llama_init_from_model(model.ptr, p)
        if not ptr:
            why = f"could not create a context (n_ctx={cfg.n_ctx}, kv={cfg.kv_type})"
            raise ModelLoadError(model.path, why)
        self.ptr: Any = ptr
        self.mem: Any = llama_cpp.llama_get_memory(ptr)
        self.n_ctx: int = llama_cpp.llama_n_ctx(ptr)
        self.n_ctx_seq: int = llama_cpp.llama_n_ctx_seq(ptr)
        self.n_batch: int = llama_cpp.llama_n_batch(ptr)
        self.n_seq_max: int = llama_cpp.llama_n_seq_max(ptr)
        self.primed: tuple[int, ...] = ()  # what sequence 0 holds from position 0 (llama/prime.py)
        self._held: threading.Event | None = None  # set once another thread's decodes into it end
        self._closed = False

    def hold(self) -> None:
        """Another thread decodes into this context first (llama/prime.py): `settle` (the engine,
        before its first decode), `warm_up` and `close` wait for its `release`, so the engine may
        take the context meanwhile."""
        self._held = threading.Event()

    @property
    def held(self) -> bool:
        """Whether another thread decodes into it, or did and nobody settled since (`hold`)."""
        return self._held is not None

    def release(self) -> None:
        if self._held is not None:
            self._held.set()

    def settle(self) -> None:
        """Wait until no other thread decodes into this context (`hold`)."""
        held = self._held
        if held is not None:
            held.wait()
            self._held = None

    def warm_up(self, model: LlamaModel) -> None:
        """Decode BOS+EOS once and forget it, as llama.cpp's common init and server do: the
        first real request then does not pay for first-touch page faults of the weights, the
        OpenMP thread pool start and one-time backend allocations. A context holding a primed
        chat head (prime.py) is warm already: those decodes ran every layer. A warm-up after them
        cost a SmolLM2 start 18-24 ms with the cores free and 90-150 ms beside the start's imports
        (two threads, one core), and a first 7-token prompt took as long without it."""
        self.settle()
        if self.primed:
            return
        toks = [t for t in (model.bos_id, model.eos_id) if 0 <= t < model.n_vocab] or [0]
        from edge.runtime.llama.batch import Batch

        batch = Batch(len(toks))
        try:
            batch.add_prompt(0, toks, 0, logits_last=True)
            llama_cpp.llama_set_warmup(self.ptr, True)
            rc = batch.decode(self.ptr)
            if rc != 0:
                log.warning("warm-up decode returned %d", rc)
        finally:
            llama_cpp.llama_set_warmup(self.ptr, False)
            batch.free()
        llama_cpp.llama_synchronize(self.ptr)
        self.clear()

    def synchronize(self) -> None:
        """Wait for the backend to finish this context's work (timings end here)."""
        llama_cpp.llama_synchronize(self.ptr)

    def set_threads(self, n_threads: int) -> None:
        llama_cpp.llama_set_n_threads(self.ptr, n_threads, n_threads)

    def seq_rm(self, seq_id: int, p0: int, p1: int = -1) -> bool:
        return bool(llama_cpp.llama_memory_seq_rm(self.mem, seq_id, p0, p1))

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        """Let `dst` own `src`'s cells of positions [p0, p1) too (shared, not copied, in a
        unified cache)."""
        llama_cpp.llama_memory_seq_cp(self.mem, src, dst, p0, p1)

    def seq_state_size(self, seq_id: int) -> int:
        return int(llama_cpp.llama_state_seq_get_size(self.ptr, seq_id))

    def seq_state(self, seq_id: int) -> bytes | memoryview:
        """A copy of one sequence's cells (positions, keys, values): see hostcache.py.

        Written straight into an anonymous mapping of its own, not the malloc heap: the host
        prompt cache holds hundreds of MiB of these, of every size, with LRU turnover, and under
        that churn glibc's heap (whose mmap threshold rises to the largest block freed)
        fragmented: a 30-minute soak grew 6.6 % in its last 20 minutes with the cache full. A
        mapping goes back to the OS whole when its entry is dropped, and nothing is copied twice."""
        size = self.seq_state_size(seq_id)
        if size <= 0:
            return b""
        mm = mmap.mmap(-1, size)
        buf = (ctypes.c_uint8 * size).from_buffer(mm)
        got = llama_cpp.llama_state_seq_get_data(self.ptr, buf, size, seq_id)
        del buf  # the mapping's export: the view below is all that holds it now
        return memoryview(mm)[:got]

    def set_seq_state(self, seq_id: int, data: bytes | memoryview) -> bool:
        """Write `seq_state` data back as sequence `seq_id` (which must hold no cells); False
        when llama.cpp could not (no room, another layout)."""
        n = len(data)
        try:
            buf = (ctypes.c_uint8 * n).from_buffer(data)  # seq_state's own mapping: no copy
        except TypeError:  # read-only bytes
            buf = (ctypes.c_uint8 * n).from_buffer_copy(data)
        return int(llama_cpp.llama_state_seq_set_data(self.ptr, buf, n, seq_id)) > 0

    def seq_pos_min(self, seq_id: int) -> int:
        return int(llama_cpp.llama_memory_seq_pos_min(self.mem, seq_id))

    def seq_pos_max(self, seq_id: int) -> int:
        return int(llama_cpp.llama_memory_seq_pos_max(self.mem, seq_id))

    def clear(self) -> None:
        llama_cpp.llama_memory_clear(self.mem, True)
        self.primed = ()

    def close(self) -> None:
        if not self._closed:
            self.settle()
            self._closed = True
            llama_cpp.llama_free(self.ptr)
