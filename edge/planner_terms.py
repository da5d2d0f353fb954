"""The per-term byte formulas of the memory plan, from a model's GGUF facts.

Each function sizes one thing llama.cpp allocates (KV cells by layer, the compute
scratch buffer, the layer split between GPU and RAM, a draft model beside the served
one); `edge.planner` adds them up and searches context and layers. Kept apart so the
formulas, which track llama.cpp's allocator, read without the search around them.
See `edge.planner`'s docstring for every formula in plain terms.
"""

from __future__ import annotations

from dataclasses import dataclass

from edge.gguf.info import GGUFInfo, kv_row_bytes
from edge.kvcache import per_sequence_streams

MIB = 1 << 20
CTX_PAD = 256  # llama.cpp pads n_ctx (and the SWA cache) to a multiple of 256
LIBRARY_BYTES = 38 * MIB  # RSS of `import llama_cpp` + backend init, measured 36.3 MiB on x86-64
PYTHON_BYTES = 52 * MIB  # interpreter + edge's server modules (FastAPI, uvicorn, pydantic): measured 50.2 MiB
VOCAB_BYTES_PER_ENTRY = 180  # measured: SmolLM2 17.5 MiB / 98k entries, Gemma-3 43.1 MiB / 262k
CONTEXT_MISC_BYTES = 2 * MIB  # graph metadata, samplers, scheduler (measured 0.7-1.4 MiB)


def pad(n: int, to: int = CTX_PAD) -> int:
    """`n` rounded up to a multiple of `to`, as llama.cpp pads its caches."""
    return -(-n // to) * to


def streams(info: GGUFInfo, n_slots: int) -> int:
    """KV streams llama.cpp keeps: one per sequence for a sliding-window model, else one pool
    (edge.kvcache.per_sequence_streams is the rule)."""
    n_swa = (info.sliding_window or 0) if info.n_swa_layers else 0
    return n_slots if per_sequence_streams(n_swa) else 1


def full_cells(info: GGUFInfo, n_ctx: int, n_slots: int) -> int:
    """Cells of the full-attention cache, every stream together (n_ctx split evenly, each padded)."""
    n_streams = streams(info, n_slots)
    return n_ctx if n_streams == 1 else n_streams * pad(-(-n_ctx // n_streams))


def swa_cells(info: GGUFInfo, n_ctx: int, n_slots: int, n_ubatch: int, swa_full: bool = False) -> int:
    """Cells of the sliding-window cache, every stream together (0 when the model has none)."""
    if not info.n_swa_layers or not info.sliding_window:
        return 0
    n_streams = streams(info, n_slots)
    per_stream = full_cells(info, n_ctx, n_slots) // n_streams
    if swa_full:
        return per_stream * n_streams
    window = info.sliding_window * (n_slots if n_streams == 1 else 1) + n_ubatch
    return n_streams * pad(min(per_stream, window))


def kv_bytes_by_layer(
    info: GGUFInfo, n_ctx: int, n_slots: int, kv_type: str, n_ubatch: int = 512, swa_full: bool = False
) -> list[int]:
    """KV bytes per layer, as llama.cpp allocates them (one pool, or a stream per sequence)."""
    n_swa_cells = swa_cells(info, n_ctx, n_slots, n_ubatch, swa_full)
    n_full = full_cells(info, n_ctx, n_slots)
    out = []
    for il in range(info.n_layer):
        cells = n_swa_cells if info.swa_layers[il] and n_swa_cells else n_full
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
    """Scratch buffer of one micro-batch graph (the formula is in `edge.planner`'s docstring)."""
    n_tok = min(n_ctx, n_ubatch, n_batch)
    n_out = min(n_outputs_max or n_batch, n_tok)
    n_ff = max(info.n_ff) if isinstance(info.n_ff, tuple) else info.n_ff
    kv_width = max((info.n_embd_k_gqa(il) for il in range(info.n_layer)), default=0)
    # the masks span one stream's cells (a micro-batch's tokens are split between the streams)
    n_streams = streams(info, n_slots)
    cells = full_cells(info, n_ctx, n_slots) + swa_cells(info, n_ctx, n_slots, n_ubatch, swa_full)
    mask_cells = cells // n_streams
    act = n_tok * (4 * (4 * n_ff + info.n_embd + kv_width) + 2 * mask_cells)
    if not flash_attn:
        per_stream = full_cells(info, n_ctx, n_slots) // n_streams
        act = n_tok * (info.n_head * per_stream * 4 + mask_cells * 4) + act * 3 // 4
    logits = info.n_vocab * n_out * 4 + n_tok * (2 * mask_cells + 8 * info.n_embd)
    return max(act, logits)


@dataclass(frozen=True)
class LayerSplit:
    """Bytes of weights and KV on each side of the GPU/RAM boundary."""

    weights_gpu: int
    weights_cpu: int
    kv_gpu: int
    kv_cpu: int


def split_layers(info: GGUFInfo, n_gpu_layers: int, kv_layers: list[int]) -> LayerSplit:
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
    return LayerSplit(gpu, cpu, kv_gpu, sum(kv_layers) - kv_gpu)


def draft_model_bytes(info: GGUFInfo, n_ctx: int, n_slots: int, kv_type: str, n_batch: int, n_ubatch: int,
                      flash_attn: bool = True, swa_full: bool = False) -> int:
    """A draft model's bytes beside the served one (runtime/spec/draft_model.py): its weights, a KV
    cache of the same cells and sequences, its compute buffer (one logits row per sequence),
    vocabulary, logits rows and context bookkeeping; the process and libraries are shared."""
    kv_layers = kv_bytes_by_layer(info, n_ctx, n_slots, kv_type, min(n_ubatch, n_batch), swa_full)
    split = split_layers(info, 0, kv_layers)
    compute = compute_bytes(info, n_ctx, n_slots, n_batch=n_batch, n_ubatch=n_ubatch, n_outputs_max=n_slots,
                            flash_attn=flash_attn, swa_full=swa_full)
    vocab = VOCAB_BYTES_PER_ENTRY * (info.n_vocab + info.n_merges)
    logits = info.n_vocab * 4 * n_slots
    return split.weights_cpu + split.kv_cpu + compute + vocab + logits + CONTEXT_MISC_BYTES
