"""Memory plan for one model: does it fit, with which context, on which device.

Every term mirrors what llama.cpp (the version vendored in llama-cpp-python 0.3.36)
allocates for the context the engine creates: one unified KV cache of n_ctx
cells shared by all slots (n_seq_max = slots, kv_unified = true, swa_full =
false) or, for a sliding-window model, a stream per slot of pad256(n_ctx / slots)
cells (kv_unified = false: edge.kvcache.per_sequence_streams), flash attention on
(llama.cpp's "auto" picks it on CPU, CUDA and Metal).

  weights  = Σ tensor bytes, split by layer: the last n_gpu_layers blocks go to
             the GPU, the output head too when n_gpu_layers > n_layer.
  kv       = Σ_layers cells(layer) × (n_embd_k_gqa + n_embd_v_gqa) × bytes(kv type),
             cells = n_ctx (padded to 256) for full-attention layers and
             min(n_ctx, pad256(n_swa × n_slots + n_ubatch)) for sliding-window
             layers (llama_kv_cache_iswa); with a stream per slot, slots ×
             pad256(min(n_ctx_seq, n_swa + n_ubatch)) for the sliding-window layers.
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

from edge.contracts.options import DEFAULT_N_BATCH, DEFAULT_N_CTX
from edge.errors import ConfigError
from edge.gguf.info import GGUFInfo
from edge.kvcache import kv_type_problem
from edge.planner_terms import (
    CONTEXT_MISC_BYTES,
    CTX_PAD,
    LIBRARY_BYTES,
    MIB,
    PYTHON_BYTES,
    VOCAB_BYTES_PER_ENTRY,
    compute_bytes,
    draft_model_bytes,
    full_cells,
    kv_bytes_by_layer,
    pad,
    split_layers,
    swa_cells,
)

AUTO_CTX_FIRST = 4096  # with gpu_layers=auto on a discrete GPU: layers are chosen at this context

__all__ = [  # the term formulas live in edge.planner_terms; importers keep using edge.planner
    "CONTEXT_MISC_BYTES",
    "CTX_PAD",
    "LIBRARY_BYTES",
    "MIB",
    "PYTHON_BYTES",
    "VOCAB_BYTES_PER_ENTRY",
    "MemoryPlan",
    "compute_bytes",
    "draft_model_bytes",
    "kv_bytes_by_layer",
    "plan_memory",
    "swa_cells",
]


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


@dataclass(frozen=True)
class _Fixed:
    """The inputs that stay the same while plan_memory searches context and GPU layers."""

    n_slots: int
    kv_type: str
    available_bytes: int
    reserve_bytes: int
    unified_memory: bool
    gpu_available_bytes: int | None
    n_batch: int
    n_ubatch: int
    n_outputs_max: int | None
    flash_attn: bool
    swa_full: bool
    draft: GGUFInfo | None


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
    n_batch: int = DEFAULT_N_BATCH,
    n_ubatch: int = DEFAULT_N_BATCH,
    n_outputs_max: int | None = None,
    flash_attn: bool = True,
    swa_full: bool = False,
    draft: GGUFInfo | None = None,
    n_ctx_max: int | None = None,
) -> MemoryPlan:
    """Plan memory for `info` (and `draft`, a draft model beside it, at the same context).

    n_ctx None: the largest context (multiple of 256, at most n_ctx_train and `n_ctx_max`)
    that fits. gpu_layers "auto": the most layers that fit (0 without a GPU, which is
    neither unified memory nor a given gpu_available_bytes). Unified memory is
    one pool; a discrete GPU must hold its share in gpu_available_bytes and the
    rest must fit in RAM. An impossible plan is returned with fits=False and a
    reason (the smallest context tried), never raised.
    """
    _validate_args(info, n_ctx, n_slots, kv_type, gpu_layers)
    fixed = _Fixed(n_slots, kv_type, available_bytes, reserve_bytes, unified_memory, gpu_available_bytes,
                   n_batch, n_ubatch, n_outputs_max, flash_attn, swa_full, draft)
    ctx_cap = max(CTX_PAD, (info.n_ctx_train // CTX_PAD) * CTX_PAD) if info.n_ctx_train else DEFAULT_N_CTX
    if n_ctx_max is not None:
        ctx_cap = max(CTX_PAD, min(ctx_cap, (n_ctx_max // CTX_PAD) * CTX_PAD))
    fixed_ctx = pad(n_ctx) if n_ctx is not None else None
    ngl = _gpu_layers(info, gpu_layers, fixed_ctx or min(ctx_cap, AUTO_CTX_FIRST), fixed)
    if fixed_ctx is not None:
        return _build(info, fixed_ctx, ngl, fixed)
    best = _largest(1, ctx_cap // CTX_PAD, lambda k: _build(info, k * CTX_PAD, ngl, fixed).fits)
    return _build(info, max(best, 1) * CTX_PAD, ngl, fixed)


def _gpu_layers(info: GGUFInfo, gpu_layers: int | str, probe_ctx: int, fixed: _Fixed) -> int:
    """Layers to offload: none without a GPU; with "auto", all on unified memory (offloading moves
    bytes, it adds none) and on a discrete GPU the most whose share fits VRAM at `probe_ctx`."""
    max_layers = info.n_layer + 1
    if not (fixed.unified_memory or fixed.gpu_available_bytes is not None):
        return 0
    if gpu_layers != "auto":
        return min(int(gpu_layers), max_layers)
    if fixed.unified_memory:
        return max_layers
    vram = fixed.gpu_available_bytes or 0
    return max(0, _largest(0, max_layers, lambda n: _build(info, probe_ctx, n, fixed).gpu_bytes <= vram))


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


def _build(info: GGUFInfo, n_ctx: int, ngl: int, fx: _Fixed) -> MemoryPlan:
    """One candidate plan: every term at this context and layer count, and whether it fits."""
    n_ubatch = min(fx.n_ubatch, fx.n_batch)
    kv_layers = kv_bytes_by_layer(info, n_ctx, fx.n_slots, fx.kv_type, n_ubatch, fx.swa_full)
    split = split_layers(info, ngl, kv_layers)
    compute = compute_bytes(info, n_ctx, fx.n_slots, n_batch=fx.n_batch, n_ubatch=fx.n_ubatch,
                            n_outputs_max=fx.n_outputs_max, flash_attn=fx.flash_attn, swa_full=fx.swa_full)
    vocab = VOCAB_BYTES_PER_ENTRY * (info.n_vocab + info.n_merges)
    output = info.n_vocab * 4 * fx.n_slots
    overhead = PYTHON_BYTES + LIBRARY_BYTES + vocab + output + CONTEXT_MISC_BYTES
    weights = split.weights_gpu + split.weights_cpu
    kv = split.kv_gpu + split.kv_cpu
    discrete_gpu = ngl > 0 and not fx.unified_memory
    drafted = 0 if fx.draft is None else draft_model_bytes(
        fx.draft, n_ctx, fx.n_slots, fx.kv_type, fx.n_batch, fx.n_ubatch, fx.flash_attn, fx.swa_full)
    gpu_bytes = split.weights_gpu + split.kv_gpu + (compute if ngl > 0 else 0) + (drafted if ngl > 0 else 0)
    if discrete_gpu:
        # RAM holds what stayed on the CPU plus a host-side compute buffer.
        ram = split.weights_cpu + split.kv_cpu + (compute if ngl < info.n_layer + 1 else 0) + overhead
        total = ram + fx.reserve_bytes
    else:
        total = weights + kv + compute + overhead + fx.reserve_bytes + drafted
    reason = _why_not(total, gpu_bytes if discrete_gpu else None, fx)
    return MemoryPlan(
        fits=not reason,
        n_ctx=n_ctx,
        n_slots=fx.n_slots,
        n_gpu_layers=ngl,
        kv_type=fx.kv_type,
        weights_bytes=weights,
        weights_gpu_bytes=split.weights_gpu,
        weights_cpu_bytes=split.weights_cpu,
        kv_bytes=kv,
        kv_gpu_bytes=split.kv_gpu,
        kv_full_cells=full_cells(info, n_ctx, fx.n_slots),
        kv_swa_cells=swa_cells(info, n_ctx, fx.n_slots, n_ubatch, fx.swa_full),
        compute_bytes=compute,
        overhead_bytes=overhead,
        python_bytes=PYTHON_BYTES,
        library_bytes=LIBRARY_BYTES,
        vocab_bytes=vocab,
        output_bytes=output,
        reserve_bytes=fx.reserve_bytes,
        total_bytes=total,
        available_bytes=fx.available_bytes,
        gpu_bytes=gpu_bytes if ngl > 0 else 0,
        gpu_available_bytes=fx.gpu_available_bytes,
        unified_memory=fx.unified_memory,
        flash_attn=fx.flash_attn,
        n_ctx_train=info.n_ctx_train,
        n_layer=info.n_layer,
        reason=reason,
        draft_bytes=drafted,
    )


def _why_not(total: int, discrete_gpu_bytes: int | None, fx: _Fixed) -> str:
    """Why a plan does not fit (RAM first, then a discrete GPU's share), or "" when it does."""
    if total > fx.available_bytes:
        need = total - fx.reserve_bytes
        return (
            f"needs {need / MIB:.0f} MiB plus a {fx.reserve_bytes / MIB:.0f} MiB reserve, "
            f"{fx.available_bytes / MIB:.0f} MiB available"
        )
    vram = fx.gpu_available_bytes or 0
    if discrete_gpu_bytes is not None and discrete_gpu_bytes > vram:
        return f"GPU share needs {discrete_gpu_bytes / MIB:.0f} MiB, {vram / MIB:.0f} MiB VRAM free"
    return ""
