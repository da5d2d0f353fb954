"""Model facts read from GGUF metadata: what `edge inspect` prints and the planner sizes.

Hyper-parameters are resolved the way llama.cpp's loader does (src/llama-model.cpp,
src/models/*.cpp), so that the memory planner predicts what llama.cpp allocates:
  - head_count / head_count_kv may be a scalar or a per-layer array;
    head_count_kv defaults to head_count (no GQA);
  - head dim = attention.key_length / value_length, else n_embd / n_head(layer 0);
  - sliding-window layers: an explicit `attention.sliding_window_pattern`
    (per-layer bool array, or an int period) wins, else the architecture's
    built-in period (gemma3: 6, so layer il is SWA unless il % 6 == 5).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from edge.errors import InvalidGGUF
from edge.gguf import constants
from edge.gguf.reader import KEEP_STRING_BYTES_MAX, GGUFArray, RawGGUF, SkippedString, shown
from edge.kvcache import KV_CACHE_TYPES

# KV cache element types → (block size, bytes per block), as ggml_row_size uses them.
KV_TYPE_BLOCKS: dict[str, tuple[int, int]] = {
    "f32": (1, 4),
    "f16": (1, 2),
    "bf16": (1, 2),
    "q8_0": (32, 34),
    "q4_0": (32, 18),
    "q4_1": (32, 20),
    "q5_0": (32, 22),
    "q5_1": (32, 24),
}

# Architecture → (SWA period, dense_first, default window) for models whose
# loader turns on standard sliding-window attention with a built-in layer pattern
# (load_swa_pattern(ml, period, dense_first) in src/models/<arch>.cpp). The window
# comes from `<arch>.attention.sliding_window`; the default applies when it is absent.
SWA_PATTERNS: dict[str, tuple[int, bool, int | None]] = {
    "gemma2": (2, False, 4096),
    "gemma3": (6, False, None),
    "gemma3n": (5, False, None),
    "cohere2": (4, False, None),
    "gpt-oss": (2, False, None),
    "exaone4": (4, False, None),
    "llama4": (4, False, None),
    "olmo2": (4, False, None),
    "afmoe": (4, False, None),
    "plamo3": (8, False, None),
}

_LAYER_RE = re.compile(r"^blk\.(\d+)\.")
# llama.cpp's LLAMA_MAX_LAYERS: its loader GGML_ASSERTs 0 < block_count <= this, aborting the process
MAX_LAYERS = 512


@dataclass(frozen=True)
class TensorInfo:
    name: str
    ggml_type: str
    shape: tuple[int, ...]
    n_bytes: int
    offset: int  # absolute file offset of the data
    layer: int | None  # block index for blk.N.* tensors


@dataclass(frozen=True)
class GGUFInfo:
    """Facts about one GGUF model file; every size is in bytes, every count in units."""

    path: str
    file_size_bytes: int
    version: int
    alignment: int
    data_offset: int
    architecture: str
    name: str | None
    n_params: int
    file_type: str | None  # e.g. "MOSTLY_Q4_1"
    quant_mix: Mapping[str, int]  # ggml type name → tensor count
    tensors: tuple[TensorInfo, ...] = field(repr=False)
    n_layer: int
    n_head: int
    n_head_kv: int | tuple[int, ...]  # per-layer tuple when the file stores an array
    n_embd: int
    n_ff: int | tuple[int, ...]
    head_dim_k: int
    head_dim_v: int
    n_ctx_train: int
    sliding_window: int | None
    swa_layers: tuple[bool, ...]  # per layer; all False without sliding-window attention
    chat_template: str | None = field(repr=False)
    license: str | None
    tokenizer_model: str | None
    n_vocab: int
    bos_token_id: int | None
    eos_token_id: int | None
    metadata: Mapping[str, Any] = field(repr=False, default_factory=dict)
    head_dim_k_swa: int | None = None
    head_dim_v_swa: int | None = None
    n_merges: int = 0  # BPE merge rules; the loader keeps them in memory with the vocabulary

    @property
    def weights_bytes(self) -> int:
        return sum(t.n_bytes for t in self.tensors)

    @property
    def n_swa_layers(self) -> int:
        return sum(self.swa_layers)

    def n_head_kv_at(self, il: int) -> int:
        return self.n_head_kv[il] if isinstance(self.n_head_kv, tuple) else self.n_head_kv

    def n_embd_k_gqa(self, il: int) -> int:
        """K row width of layer `il` in the KV cache (head dim × KV heads)."""
        dim = self.head_dim_k_swa if self.swa_layers[il] and self.head_dim_k_swa else self.head_dim_k
        return dim * self.n_head_kv_at(il)

    def n_embd_v_gqa(self, il: int) -> int:
        dim = self.head_dim_v_swa if self.swa_layers[il] and self.head_dim_v_swa else self.head_dim_v
        return dim * self.n_head_kv_at(il)

    def kv_bytes_per_token(self, kv_type: str = "f16", *, swa: bool | None = None) -> int:
        """KV bytes one cached token costs, summed over layers (`swa`: only SWA or non-SWA layers)."""
        total = 0
        for il in range(self.n_layer):
            if swa is not None and self.swa_layers[il] != swa:
                continue
            total += kv_row_bytes(kv_type, self.n_embd_k_gqa(il)) + kv_row_bytes(
                kv_type, self.n_embd_v_gqa(il)
            )
        return total


def info_to_json(info: GGUFInfo) -> dict[str, Any]:
    """The stable keys of `edge inspect --json`."""
    return {
        "path": info.path,
        "file_size_bytes": info.file_size_bytes,
        "gguf_version": info.version,
        "architecture": info.architecture,
        "name": info.name,
        "n_params": info.n_params,
        "file_type": info.file_type,
        "quant_mix": dict(info.quant_mix),
        "n_tensors": len(info.tensors),
        "weights_bytes": info.weights_bytes,
        "n_layer": info.n_layer,
        "n_head": info.n_head,
        "n_head_kv": list(info.n_head_kv) if isinstance(info.n_head_kv, tuple) else info.n_head_kv,
        "n_embd": info.n_embd,
        "n_ff": list(info.n_ff) if isinstance(info.n_ff, tuple) else info.n_ff,
        "head_dim_k": info.head_dim_k,
        "head_dim_v": info.head_dim_v,
        "n_ctx_train": info.n_ctx_train,
        "sliding_window": info.sliding_window,
        "swa_layers": [il for il, swa in enumerate(info.swa_layers) if swa],
        "kv_bytes_per_token": {t: info.kv_bytes_per_token(t) for t in KV_CACHE_TYPES},
        "chat_template": info.chat_template is not None,
        "license": info.license,
        "tokenizer_model": info.tokenizer_model,
        "n_vocab": info.n_vocab,
        "bos_token_id": info.bos_token_id,
        "eos_token_id": info.eos_token_id,
    }


def kv_row_bytes(kv_type: str, n_elems: int) -> int:
    """Bytes of `n_elems` KV elements of `kv_type` (q8_0: 34 bytes per 32, q4_0: 18 per 32)."""
    try:
        block, size = KV_TYPE_BLOCKS[kv_type]
    except KeyError:
        raise ValueError(f"unknown KV type {kv_type!r}; known: {', '.join(KV_TYPE_BLOCKS)}") from None
    return -(-n_elems // block) * size


class _Meta:
    """Typed access to metadata; a wrong type is an InvalidGGUF naming the key."""

    def __init__(self, raw: RawGGUF, path: str) -> None:
        self.kv = raw.kv
        self.path = path

    def bad(self, key: str, want: str) -> InvalidGGUF:
        return InvalidGGUF(self.path, f"key '{shown(key)}' must be {want}, got {type(self.kv[key]).__name__}")

    def int_(self, key: str, default: int | None = None, *, required: bool = False) -> int | None:
        if key not in self.kv:
            if required:
                raise InvalidGGUF(self.path, f"missing required key '{shown(key)}'")
            return default
        v = self.kv[key]
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.bad(key, "an integer")
        if v < 0:
            raise InvalidGGUF(self.path, f"key '{shown(key)}' is negative ({v})")
        return v

    def str_(self, key: str) -> str | None:
        if key not in self.kv:
            return None
        v = self.kv[key]
        if isinstance(v, SkippedString):
            raise InvalidGGUF(
                self.path, f"key '{shown(key)}' is {v.n_bytes} bytes, above the {KEEP_STRING_BYTES_MAX} limit"
            )
        if not isinstance(v, str):
            raise self.bad(key, "a string")
        return v

    def int_or_layers(self, key: str, n_layer: int, default: int) -> int | tuple[int, ...]:
        """A scalar, or a per-layer array of n_layer integers (collapsed when all equal)."""
        if key not in self.kv:
            return default
        v = self.kv[key]
        if isinstance(v, GGUFArray):
            if v.values is None or v.count != n_layer or v.elem_type in ("string", "float32", "float64"):
                raise InvalidGGUF(self.path, f"key '{shown(key)}' must be an integer or {n_layer} integers")
            vals = tuple(int(x) for x in v.values)
            if any(x < 0 for x in vals):
                raise InvalidGGUF(self.path, f"key '{shown(key)}' has a negative entry")
            return vals[0] if len(set(vals)) == 1 else vals
        return self.int_(key, default) or 0


def _swa_layers(meta: _Meta, arch: str, n_layer: int) -> tuple[int | None, tuple[bool, ...]]:
    """(window, per-layer SWA flags) as llama.cpp's loader resolves them."""
    known = SWA_PATTERNS.get(arch)
    window = meta.int_(f"{arch}.attention.sliding_window", known[2] if known else None)
    none = (False,) * n_layer
    if not window:
        return None, none
    pkey = f"{arch}.attention.sliding_window_pattern"
    pattern = meta.kv.get(pkey)
    if isinstance(pattern, GGUFArray):
        if pattern.values is None or pattern.count != n_layer:
            raise InvalidGGUF(meta.path, f"key '{shown(pkey)}' must hold {n_layer} entries")
        return window, tuple(bool(x) for x in pattern.values)
    if known is None and pattern is None:
        return window, none  # architecture without SWA support in llama.cpp: all layers full
    period = meta.int_(pkey, known[0] if known else 0) or 0
    dense_first = known[1] if known else False
    if dense_first:
        flags = tuple(period == 0 or il % period != 0 for il in range(n_layer))
    else:
        flags = tuple(period == 0 or il % period < period - 1 for il in range(n_layer))
    return window, flags


def _n_vocab(meta: _Meta, arch: str, tensors: tuple[TensorInfo, ...]) -> int:
    tokens = meta.kv.get("tokenizer.ggml.tokens")
    if isinstance(tokens, GGUFArray):
        return tokens.count
    v = meta.int_(f"{arch}.vocab_size")
    if v:
        return v
    for t in tensors:
        if t.name == "token_embd.weight" and len(t.shape) >= 2:
            return t.shape[1]
    return 0


def build_info(raw: RawGGUF, path: str, sizes: list[int], type_names: dict[int, str]) -> GGUFInfo:
    """Derive model facts from a parsed, layout-checked file."""
    meta = _Meta(raw, path)
    arch = meta.str_("general.architecture")
    if not arch:
        raise InvalidGGUF(path, "missing required key 'general.architecture'")
    hparams = _hparams(meta, arch, path)
    tensors = _tensor_infos(raw, sizes, type_names)
    file_type = _file_type(meta.int_("general.file_type"))
    template = meta.str_("tokenizer.chat_template")
    small_meta = {
        k: v
        for k, v in raw.kv.items()
        if not isinstance(v, (GGUFArray, SkippedString)) and k != "tokenizer.chat_template"
    }
    merges = raw.kv.get("tokenizer.ggml.merges")
    return GGUFInfo(
        path=path,
        file_size_bytes=raw.file_size_bytes,
        version=raw.version,
        alignment=raw.alignment,
        data_offset=raw.data_offset,
        architecture=arch,
        name=meta.str_("general.name"),
        n_params=sum(math.prod(t.shape) for t in tensors),
        file_type=file_type,
        quant_mix=dict(Counter(t.ggml_type for t in tensors).most_common()),
        tensors=tensors,
        **hparams,
        chat_template=template or None,
        license=meta.str_("general.license"),
        tokenizer_model=meta.str_("tokenizer.ggml.model"),
        n_vocab=_n_vocab(meta, arch, tensors),
        bos_token_id=meta.int_("tokenizer.ggml.bos_token_id"),
        eos_token_id=meta.int_("tokenizer.ggml.eos_token_id"),
        metadata=small_meta,
        head_dim_k_swa=meta.int_(f"{arch}.attention.key_length_swa"),
        head_dim_v_swa=meta.int_(f"{arch}.attention.value_length_swa"),
        n_merges=merges.count if isinstance(merges, GGUFArray) else 0,
    )


def _check_epsilons(meta: _Meta, arch: str) -> None:
    """Norm epsilons must be finite and >= 0: ggml GGML_ASSERTs eps >= 0 (a NaN fails it too) at the
    first decode, which kills the process long after the model loaded."""
    for key, v in meta.kv.items():
        if key.startswith(f"{arch}.") and key.endswith("epsilon") and (
            isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0
        ):
            raise InvalidGGUF(meta.path, f"key '{shown(key)}' must be a finite number >= 0, not {v!r:.40}")


def _hparams(meta: _Meta, arch: str, path: str) -> dict[str, Any]:
    """The shape hyper-parameters, GGUFInfo's field names as keys, checked in the loader's order."""
    n_layer = meta.int_(f"{arch}.block_count", required=True) or 0
    if not 1 <= n_layer <= MAX_LAYERS:
        raise InvalidGGUF(path, f"key '{shown(arch)}.block_count' is {n_layer}, outside 1..{MAX_LAYERS}")
    _check_epsilons(meta, arch)
    n_embd = meta.int_(f"{arch}.embedding_length", required=True) or 0
    n_ctx_train = meta.int_(f"{arch}.context_length", required=True) or 0
    head = meta.int_or_layers(f"{arch}.attention.head_count", n_layer, 0)
    n_head = head if isinstance(head, int) else head[0]
    n_head_kv = meta.int_or_layers(f"{arch}.attention.head_count_kv", n_layer, -1)
    if n_head_kv == -1:
        n_head_kv = head
    n_ff = meta.int_or_layers(f"{arch}.feed_forward_length", n_layer, 0)
    default_dim = n_embd // n_head if n_head else 0
    head_dim_k = meta.int_(f"{arch}.attention.key_length", default_dim) or 0
    head_dim_v = meta.int_(f"{arch}.attention.value_length", default_dim) or 0
    window, swa_layers = _swa_layers(meta, arch, n_layer)
    return {
        "n_layer": n_layer, "n_head": n_head, "n_head_kv": n_head_kv, "n_embd": n_embd, "n_ff": n_ff,
        "head_dim_k": head_dim_k, "head_dim_v": head_dim_v, "n_ctx_train": n_ctx_train,
        "sliding_window": window, "swa_layers": swa_layers,
    }


def _tensor_infos(raw: RawGGUF, sizes: list[int], type_names: dict[int, str]) -> tuple[TensorInfo, ...]:
    return tuple(
        TensorInfo(
            name=t.name,
            ggml_type=type_names[t.ggml_type],
            shape=t.shape,
            n_bytes=n,
            offset=raw.data_offset + t.offset,
            layer=int(m.group(1)) if (m := _LAYER_RE.match(t.name)) else None,
        )
        for t, n in zip(raw.tensors, sizes, strict=True)
    )


def _file_type(ft: int | None) -> str | None:
    """`general.file_type` as llama.cpp's name for it (e.g. MOSTLY_Q4_1); unknown values kept."""
    try:
        return constants.LlamaFileType(ft).name if ft is not None else None
    except ValueError:
        return f"UNKNOWN_{ft}"
