"""Memory plan for one model: does it fit, with which context, on which device.

Every term mirrors what llama.cpp (the version vendored in llama-cpp-python 0.3.36)
allocates for the context the engine creates: one unified KV cache of n_ctx
cells shared by all slots (n_seq_max = slots, kv_unified = true, swa_full =
false), flash attention on (llama.cpp's "auto" picks it on CPU, CUDA and Metal).

  weights  = Σ tensor bytes, split by layer: the last n_gpu_layers blocks go to
             the GPU, the output head too when n_gpu_layers > n_layer.
  kv       = Σ_layers cells(layer) × (n_embd_k_gqa + n_embd_v_gqa) × bytes(kv type),
             cells = n_ctx (padded to 256) for full-attention layers and
             min(n_ctx, pad256(n_swa × n_slots + n_ubatch)) for sliding-window
             layers (llama_kv_cache_iswa).
  compute  = the graph's scratch buffer, calibrated against llama.cpp's
             "compute buffer size" for SmolLM2-135M and Gemma-3-270M within 2%:
               act    = T × (4·(4·n_ff + n_embd + n_embd_k_gqa) + 2·mask_cells)
               logits = n_vocab × n_out × 4 + T × (2·mask_cells + 8·n_embd)
               compute = max(act, logits)
             with T = min(n_ctx, n_ubatch) tokens per micro-batch, n_out the
             outputs reserved per micro-batch (n_outputs_max, llama.cpp default
             n_batch), mask_cells = n_ctx (+ SWA cells). Without flash attention the
             KQ matrix T × n_head × n_ctx × 4 (plus f32 masks) replaces most of it.
  overhead = the Python process with edge's server modules (measured), llama.cpp
             libraries + bindings (measured RSS of `import llama_cpp`), the
             vocabulary the loader keeps (~180 bytes per token or merge rule,
             measured), the logits output buffer n_vocab × 4 × slots, and
             context bookkeeping.
  reserve  = memory left to the OS and other programs (device profile).
  draft    = a draft model's (--speculative draft) weights, KV for the same cells and slots,
             compute buffer, vocabulary and logits rows, planned by the same terms; it goes
             where the served model's layers go (the GPU when any are offloaded).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from edge.errors import ConfigError
from edge.gguf.info import GGUFInfo, kv_row_bytes
from edge.kvcache import kv_type_problem

MIB = 1 << 20
CTX_PAD = 256  # llama.cpp pads n_ctx (and the SWA cache) to a multiple of 256
LIBRARY_BYTES = 38 * MIB  # RSS of `import llama_cpp` + backend init, measured 36.3 MiB on x86-64
PYTHON_BYTES = 52 * MIB  # interpreter + edge's server modules (FastAPI, uvicorn, pydantic): measured 50.2 MiB
VOCAB_BYTES_PER_ENTRY = 180  # measured: SmolLM2 17.5 MiB / 98k entries, Gemma-3 43.1 MiB / 262k
CONTEXT_MISC_BYTES = 2 * MIB  # graph metadata, samplers, scheduler (measured 0.7-1.4 MiB)
AUTO_CTX_FIRST = 4096  # with gpu_layers=auto on a discrete GPU: layers are chosen at this context


@dataclass(frozen=True)
class MemoryPlan:
    """How a model would be loaded and what each part costs, in bytes."""

    fits: bool
    n_ctx: int
    n_slots: int
    n_gpu_layers: int
    kv_type: str
    weights_bytes: int
    weights_gpu_bytes: int
    weights_cpu_bytes: int
    kv_bytes: int
    kv_gpu_bytes: int
    kv_full_cells: int
    kv_swa_cells: int
    compute_bytes: int
    overhead_bytes: int
    python_bytes: int
    library_bytes: int
    vocab_bytes: int
    output_bytes: int
    reserve_bytes: int
    total_bytes: int
    available_bytes: int
    gpu_bytes: int
    gpu_available_bytes: int | None
    unified_memory: bool
    flash_attn: bool
    n_ctx_train: int
    n_layer: int
    reason: str  # why it does not fit, or "" when it does
    draft_bytes: int = 0  # the draft model's part of total_bytes (speculative decoding)
    attn_free: bool = False  # edge times both attention kinds at load; budgeted for the larger buffer

    @property
    def shortfall_bytes(self) -> int:
        return max(0, self.total_bytes - self.available_bytes)

    def to_json(self) -> dict[str, Any]:
        """The stable keys of `edge plan --json`."""
        keys = (
            "fits",
            "n_ctx",
            "n_gpu_layers",
            "kv_type",
            "weights_bytes",
            "kv_bytes",
            "compute_bytes",
            "overhead_bytes",
            "reserve_bytes",
            "total_bytes",
            "available_bytes",
            "draft_bytes",
        )
        d = asdict(self)
        return {k: d[k] for k in keys}

    def _attn_words(self) -> str:
        if self.attn_free:
            return "on or off as measured at load (budgeted without it, the larger buffer)"
        return "on" if self.flash_attn else "off"

    def explain(self) -> str:
        """Every term in plain words, one per line."""

        def mib(n: int) -> str:
            return f"{n / MIB:9.1f} MiB"

        where = "on the GPU" if self.n_gpu_layers else "in RAM"
        swa = (
            f"; sliding-window layers keep only {self.kv_swa_cells} cells"
            if self.kv_swa_cells and self.kv_swa_cells != self.kv_full_cells
            else ""
        )
        lines = [
            f"weights  {mib(self.weights_bytes)}  the model's tensors; {self.n_gpu_layers} of "
            f"{self.n_layer + 1} layers (incl. output) offloaded ({mib(self.weights_gpu_bytes).strip()} "
            f"on the GPU, {mib(self.weights_cpu_bytes).strip()} in RAM)",
            f"kv cache {mib(self.kv_bytes)}  keys and values for {self.n_ctx} context tokens shared by "
            f"{self.n_slots} slots, stored as {self.kv_type}{swa}",
            f"compute  {mib(self.compute_bytes)}  scratch memory for one micro-batch (activations, "
            f"attention mask, logits), {where}; flash attention {self._attn_words()}",
            f"overhead {mib(self.overhead_bytes)}  Python and edge {mib(self.python_bytes).strip()}, "
            f"llama.cpp libraries {mib(self.library_bytes).strip()}, "
            f"vocabulary {mib(self.vocab_bytes).strip()}, "
            f"logits output {mib(self.output_bytes).strip()}, bookkeeping",
            *([f"draft    {mib(self.draft_bytes)}  the draft model (speculative decoding): weights, "
               f"kv cache, compute, vocabulary"] if self.draft_bytes else []),
            f"reserve  {mib(self.reserve_bytes)}  left free for the OS and other programs",
            f"total    {mib(self.total_bytes)}  of {mib(self.available_bytes).strip()} available"
            + (" (one pool shared by CPU and GPU)" if self.unified_memory else " RAM"),
        ]
        if self.gpu_available_bytes is not None and not self.unified_memory:
            lines.append(f"gpu      {mib(self.gpu_bytes)}  of {mib(self.gpu_available_bytes).strip()} VRAM")
        lines.append("fits: yes" if self.fits else f"fits: NO - {self.reason}")
        if self.n_ctx > self.n_ctx_train > 0:
            lines.append(
                f"note: context {self.n_ctx} exceeds the {self.n_ctx_train} tokens the model was trained on"
            )
        return "\n".join(lines)


def _pad(n: int, to: int = CTX_PAD) -> int:
    return -(-n // to) * to


def swa_cells(info: GGUFInfo, n_ctx: int, n_slots: int, n_ubatch: int, swa_full: bool = False) -> int:
    """Cells of the sliding-window cache (0 when the model has no SWA layers)."""
    if not info.n_swa_layers or not info.sliding_window:
        return 0
    if swa_full:
        return n_ctx
    return min(n_ctx, _pad(info.sliding_window * n_slots + n_ubatch))


def kv_bytes_by_layer(
    info: GGUFInfo, n_ctx: int, n_slots: int, kv_type: str, n_ubatch: int = 512, swa_full: bool = False
) -> list[int]:
    """KV bytes per layer, as llama.cpp allocates them for a unified cache."""
    n_swa_cells = swa_cells(info, n_ctx, n_slots, n_ubatch, swa_full)
    out = []
    for il in range(info.n_layer):
        cells = n_swa_cells if info.swa_layers[il] and n_swa_cells else n_ctx
        out.append(
            cells * (kv_row_bytes(kv_type, info.n_embd_k_gqa(il))
                     + kv_row_bytes(kv_type, info.n_embd_v_gqa(il)))
        )
    return out


def compute_bytes(
    info: GGUFInfo,
    n_ctx: int,
    n_slots: int,
    *,
    n_batch: int = 512,
    n_ubatch: int = 512,
    n_outputs_max: int | None = None,
    flash_attn: bool = True,
    swa_full: bool = False,
) -> int:
    """Scratch buffer of one micro-batch graph (see the module docstring for the formula)."""
    n_tok = min(n_ctx, n_ubatch, n_batch)
    n_out = min(n_outputs_max or n_batch, n_tok)
    n_ff = max(info.n_ff) if isinstance(info.n_ff, tuple) else info.n_ff
    kv_width = max((info.n_embd_k_gqa(il) for il in range(info.n_layer)), default=0)
    mask_cells = n_ctx + swa_cells(info, n_ctx, n_slots, n_ubatch, swa_full)
    act = n_tok * (4 * (4 * n_ff + info.n_embd + kv_width) + 2 * mask_cells)
    if not flash_attn:
        act = n_tok * (info.n_head * n_ctx * 4 + mask_cells * 4) + act * 3 // 4
    logits = info.n_vocab * n_out * 4 + n_tok * (2 * mask_cells + 8 * info.n_embd)
    return max(act, logits)


@dataclass(frozen=True)
class _Split:
    weights_gpu: int
    weights_cpu: int
    kv_gpu: int
    kv_cpu: int


def _split(info: GGUFInfo, n_gpu_layers: int, kv_layers: list[int]) -> _Split:
    """Place tensors and KV like llama.cpp: the last n_gpu_layers blocks, then the output head."""
    first_gpu = info.n_layer - min(n_gpu_layers, info.n_layer)
    head_on_gpu = n_gpu_layers > info.n_layer
    has_output = any(t.name == "output.weight" for t in info.tensors)
    gpu = cpu = 0
    for t in info.tensors:
        on_gpu = (t.layer is not None and t.layer >= first_gpu) or (
            t.layer is None and head_on_gpu and t.name.startswith("output")
        )
        if on_gpu:
            gpu += t.n_bytes
        else:
            cpu += t.n_bytes
        if head_on_gpu and not has_output and t.name == "token_embd.weight":
            gpu += t.n_bytes  # tied embeddings: llama.cpp duplicates them as the GPU output head
    kv_gpu = sum(kv_layers[first_gpu:])
    return _Split(gpu, cpu, kv_gpu, sum(kv_layers) - kv_gpu)


def _validate_args(
    info: GGUFInfo, n_ctx: int | None, n_slots: int, kv_type: str, gpu_layers: int | str
) -> None:
    problem = kv_type_problem(kv_type)
    if problem is not None:
        raise ConfigError("kv_type", problem)
    if n_slots < 1:
        raise ConfigError("slots", f"must be at least 1, not {n_slots}")
    if n_ctx is not None and n_ctx < 1:
        raise ConfigError("n_ctx", f"must be positive, not {n_ctx}")
    if gpu_layers != "auto" and (not isinstance(gpu_layers, int) or gpu_layers < 0):
        raise ConfigError("gpu_layers", f"must be a non-negative integer or 'auto', not {gpu_layers!r}")
    if kv_type != "f16" and info.head_dim_k % 32:
        raise ConfigError(
            "kv_type", f"{kv_type} needs a head size divisible by 32, this model has {info.head_dim_k}"
        )


def plan_memory(
    info: GGUFInfo,
    *,
    n_ctx: int | None,
    n_slots: int,
    kv_type: str,
    gpu_layers: int | Literal["auto"] | str,
    available_bytes: int,
    reserve_bytes: int,
    unified_memory: bool,
    gpu_available_bytes: int | None = None,
    n_batch: int = 512,
    n_ubatch: int = 512,
    n_outputs_max: int | None = None,
    flash_attn: bool = True,
    swa_full: bool = False,
    draft: GGUFInfo | None = None,
) -> MemoryPlan:
    """Plan memory for `info` (and `draft`, a draft model beside it, at the same context).

    n_ctx None: the largest context (multiple of 256, at most n_ctx_train) that
    fits. gpu_layers "auto": the most layers that fit (0 without a GPU, which is
    neither unified memory nor a given gpu_available_bytes). Unified memory is
    one pool; a discrete GPU must hold its share in gpu_available_bytes and the
    rest must fit in RAM. An impossible plan is returned with fits=False and a
    reason (the smallest context tried), never raised.
    """
    _validate_args(info, n_ctx, n_slots, kv_type, gpu_layers)
    has_gpu = unified_memory or gpu_available_bytes is not None
    max_layers = info.n_layer + 1

    def build(ctx: int, ngl: int) -> MemoryPlan:
        return _build(
            info,
            ctx,
            ngl,
            n_slots=n_slots,
            kv_type=kv_type,
            available_bytes=available_bytes,
            reserve_bytes=reserve_bytes,
            unified_memory=unified_memory,
            gpu_available_bytes=gpu_available_bytes,
            n_batch=n_batch,
            n_ubatch=n_ubatch,
            n_outputs_max=n_outputs_max,
            flash_attn=flash_attn,
            swa_full=swa_full,
            draft=draft,
        )

    ctx_cap = max(CTX_PAD, (info.n_ctx_train // CTX_PAD) * CTX_PAD) if info.n_ctx_train else 4096
    fixed_ctx = _pad(n_ctx) if n_ctx is not None else None

    if gpu_layers == "auto":
        if not has_gpu:
            ngl = 0
        elif unified_memory:
            ngl = max_layers  # one pool: offloading moves bytes, it does not add any
        else:
            probe_ctx = fixed_ctx or min(ctx_cap, AUTO_CTX_FIRST)
            vram = gpu_available_bytes or 0
            ngl = max(0, _largest(0, max_layers, lambda n: build(probe_ctx, n).gpu_bytes <= vram))
    else:
        ngl = min(int(gpu_layers), max_layers) if has_gpu else 0

    if fixed_ctx is not None:
        return build(fixed_ctx, ngl)
    steps = ctx_cap // CTX_PAD
    best = _largest(1, steps, lambda k: build(k * CTX_PAD, ngl).fits)
    return build(max(best, 1) * CTX_PAD, ngl)


def _largest(lo: int, hi: int, ok: Any) -> int:
    """Largest n in [lo, hi] with ok(n) (ok monotone: true then false); lo-1 when none."""
    if not ok(lo):
        return lo - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _build(
    info: GGUFInfo,
    n_ctx: int,
    ngl: int,
    *,
    n_slots: int,
    kv_type: str,
    available_bytes: int,
    reserve_bytes: int,
    unified_memory: bool,
    gpu_available_bytes: int | None,
    n_batch: int,
    n_ubatch: int,
    n_outputs_max: int | None,
    flash_attn: bool,
    swa_full: bool,
    draft: GGUFInfo | None = None,
) -> MemoryPlan:
    kv_layers = kv_bytes_by_layer(info, n_ctx, n_slots, kv_type, min(n_ubatch, n_batch), swa_full)
    split = _split(info, ngl, kv_layers)
    compute = compute_bytes(
        info,
        n_ctx,
        n_slots,
        n_batch=n_batch,
        n_ubatch=n_ubatch,
        n_outputs_max=n_outputs_max,
        flash_attn=flash_attn,
        swa_full=swa_full,
    )
    vocab = VOCAB_BYTES_PER_ENTRY * (info.n_vocab + info.n_merges)
    output = info.n_vocab * 4 * n_slots
    overhead = PYTHON_BYTES + LIBRARY_BYTES + vocab + output + CONTEXT_MISC_BYTES
    weights = split.weights_gpu + split.weights_cpu
    kv = split.kv_gpu + split.kv_cpu
    discrete_gpu = ngl > 0 and not unified_memory
    drafted = 0 if draft is None else draft_model_bytes(draft, n_ctx, n_slots, kv_type, n_batch, n_ubatch,
                                                        flash_attn, swa_full)
    gpu_bytes = split.weights_gpu + split.kv_gpu + (compute if ngl > 0 else 0) + (drafted if ngl > 0 else 0)
    if discrete_gpu:
        # RAM holds what stayed on the CPU plus a host-side compute buffer.
        ram = split.weights_cpu + split.kv_cpu + (compute if ngl < info.n_layer + 1 else 0) + overhead
        total = ram + reserve_bytes
    else:
        total = weights + kv + compute + overhead + reserve_bytes + drafted
    reason = ""
    if total > available_bytes:
        need = total - reserve_bytes
        reason = (
            f"needs {need / MIB:.0f} MiB plus a {reserve_bytes / MIB:.0f} MiB reserve, "
            f"{available_bytes / MIB:.0f} MiB available"
        )
    elif discrete_gpu and gpu_bytes > (gpu_available_bytes or 0):
        reason = (
            f"GPU share needs {gpu_bytes / MIB:.0f} MiB, {(gpu_available_bytes or 0) / MIB:.0f} MiB VRAM free"
        )
    return MemoryPlan(
        fits=not reason,
        n_ctx=n_ctx,
        n_slots=n_slots,
        n_gpu_layers=ngl,
        kv_type=kv_type,
        weights_bytes=weights,
        weights_gpu_bytes=split.weights_gpu,
        weights_cpu_bytes=split.weights_cpu,
        kv_bytes=kv,
        kv_gpu_bytes=split.kv_gpu,
        kv_full_cells=n_ctx,
        kv_swa_cells=swa_cells(info, n_ctx, n_slots, min(n_ubatch, n_batch), swa_full),
        compute_bytes=compute,
        overhead_bytes=overhead,
        python_bytes=PYTHON_BYTES,
        library_bytes=LIBRARY_BYTES,
        vocab_bytes=vocab,
        output_bytes=output,
        reserve_bytes=reserve_bytes,
        total_bytes=total,
        available_bytes=available_bytes,
        gpu_bytes=gpu_bytes if ngl > 0 else 0,
        gpu_available_bytes=gpu_available_bytes,
        unified_memory=unified_memory,
        flash_attn=flash_attn,
        n_ctx_train=info.n_ctx_train,
        n_layer=info.n_layer,
        reason=reason,
        draft_bytes=drafted,
    )


def draft_model_bytes(info: GGUFInfo, n_ctx: int, n_slots: int, kv_type: str, n_batch: int, n_ubatch: int,
                      flash_attn: bool = True, swa_full: bool = False) -> int:
    """A draft model's bytes beside the served one (runtime/draft_model.py): its weights, a KV
    cache of the same cells and sequences, its compute buffer (one logits row per sequence),
    vocabulary, logits rows and context bookkeeping; the process and libraries are shared."""
    kv_layers = kv_bytes_by_layer(info, n_ctx, n_slots, kv_type, min(n_ubatch, n_batch), swa_full)
    split = _split(info, 0, kv_layers)
    compute = compute_bytes(info, n_ctx, n_slots, n_batch=n_batch, n_ubatch=n_ubatch, n_outputs_max=n_slots,
                            flash_attn=flash_attn, swa_full=swa_full)
    vocab = VOCAB_BYTES_PER_ENTRY * (info.n_vocab + info.n_merges)
    logits = info.n_vocab * 4 * n_slots
    return split.weights_cpu + split.kv_cpu + compute + vocab + logits + CONTEXT_MISC_BYTES
