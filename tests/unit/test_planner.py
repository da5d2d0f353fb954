"""Memory planner on synthetic GGUFs: KV formula, context and layer choice, memory kinds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from edge.errors import ConfigError
from edge.gguf import GGUFInfo, validate_gguf
from edge.planner import MIB, MemoryPlan, compute_bytes, plan_memory
from tests.ggufgen import write_tiny_model

GIB = 1 << 30


@pytest.fixture(scope="module")
def gemma_like(tmp_path_factory: pytest.TempPathFactory) -> GGUFInfo:
    path = tmp_path_factory.mktemp("g") / "g.gguf"
    return validate_gguf(
        write_tiny_model(
            path,
            arch="gemma3",
            n_layer=6,
            n_embd=64,
            n_head=4,
            n_head_kv=1,
            head_dim=64,
            sliding_window=64,
            n_ctx_train=32768,
            n_vocab=128,
        )
    )


@pytest.fixture(scope="module")
def llama_like(tmp_path_factory: pytest.TempPathFactory) -> GGUFInfo:
    path = tmp_path_factory.mktemp("l") / "l.gguf"
    return validate_gguf(
        write_tiny_model(path, n_layer=8, n_embd=128, n_head=4, n_head_kv=2, n_ff=256, n_ctx_train=8192)
    )


def _plan(info: GGUFInfo, **kw: Any) -> MemoryPlan:
    args: dict[str, Any] = dict(
        n_ctx=2048,
        n_slots=4,
        kv_type="f16",
        gpu_layers=0,
        available_bytes=64 * GIB,
        reserve_bytes=0,
        unified_memory=False,
    )
    args.update(kw)
    return plan_memory(info, **args)


def test_kv_full_attention_formula(llama_like: GGUFInfo) -> None:
    plan = _plan(llama_like, n_ctx=4096)
    per_token = llama_like.n_layer * 2 * (2 * 32) * 2  # layers × (K+V) × (kv heads × head dim) × f16
    assert plan.kv_bytes == 4096 * per_token
    assert _plan(llama_like, n_ctx=4096, kv_type="q8_0").kv_bytes == 4096 * llama_like.n_layer * 2 * 2 * 34
    assert _plan(llama_like, n_ctx=4096, kv_type="q4_0").kv_bytes == 4096 * llama_like.n_layer * 2 * 2 * 18


def test_kv_sliding_window_layers_at_window(gemma_like: GGUFInfo) -> None:
    plan = _plan(gemma_like, n_ctx=8192, n_slots=2, n_ubatch=512)
    row = 2 * 64 * 2  # K+V, one kv head of 64 dims, f16
    # a stream per slot (kvcache.per_sequence_streams): each of 4096 cells, its window
    # pad256(min(n_ctx_seq, n_swa + n_ubatch)) = 768 cells
    swa_cells = 2 * (-(-(64 + 512) // 256) * 256)
    assert plan.kv_swa_cells == swa_cells == 1536 and plan.kv_full_cells == 8192
    assert plan.kv_bytes == 1 * 8192 * row + 5 * swa_cells * row  # layer 5 is the only global one
    # small contexts: the SWA cache is never larger than the context
    small = _plan(gemma_like, n_ctx=512, n_slots=2)
    assert small.kv_swa_cells == 512 and small.kv_bytes == 6 * 512 * row
    # swa_full: every layer gets the whole context
    assert _plan(gemma_like, n_ctx=8192, n_slots=2, swa_full=True).kv_bytes == 6 * 8192 * row


def test_context_is_padded_like_llama_cpp(llama_like: GGUFInfo) -> None:
    assert _plan(llama_like, n_ctx=1000).n_ctx == 1024
    assert _plan(llama_like, n_ctx=1024).n_ctx == 1024


def test_picks_largest_context_that_fits(llama_like: GGUFInfo) -> None:
    base = _plan(llama_like, n_ctx=256)
    budget = base.total_bytes + 3000 * llama_like.kv_bytes_per_token("f16")
    plan = _plan(llama_like, n_ctx=None, available_bytes=budget)
    assert plan.fits and plan.n_ctx % 256 == 0
    assert plan.total_bytes <= budget
    assert not _plan(llama_like, n_ctx=plan.n_ctx + 256, available_bytes=budget).fits
    # plenty of memory: capped at the training context
    assert _plan(llama_like, n_ctx=None, available_bytes=64 * GIB).n_ctx == 8192


def test_does_not_fit(llama_like: GGUFInfo) -> None:
    plan = _plan(llama_like, n_ctx=None, available_bytes=10 * MIB, reserve_bytes=8 * MIB)
    assert not plan.fits
    assert plan.n_ctx == 256
    assert "reserve" in plan.reason and "available" in plan.reason
    assert plan.shortfall_bytes == plan.total_bytes - 10 * MIB > 0
    assert "fits: NO" in plan.explain()


def test_total_is_the_sum_of_terms(llama_like: GGUFInfo) -> None:
    plan = _plan(llama_like, reserve_bytes=100 * MIB)
    terms = plan.weights_bytes + plan.kv_bytes + plan.compute_bytes + plan.overhead_bytes + plan.reserve_bytes
    assert plan.total_bytes == terms
    assert plan.weights_bytes == llama_like.weights_bytes
    assert plan.overhead_bytes == (
        plan.python_bytes + plan.library_bytes + plan.vocab_bytes + plan.output_bytes + 2 * MIB
    )
    assert plan.output_bytes == llama_like.n_vocab * 4 * 4


def test_gpu_layers_auto_without_gpu_is_zero(llama_like: GGUFInfo) -> None:
    plan = _plan(llama_like, gpu_layers="auto")
    assert plan.n_gpu_layers == 0 and plan.weights_gpu_bytes == 0 and plan.gpu_bytes == 0


def test_gpu_layers_auto_unified_offloads_everything(llama_like: GGUFInfo) -> None:
    plan = _plan(llama_like, gpu_layers="auto", unified_memory=True)
    assert plan.n_gpu_layers == llama_like.n_layer + 1
    assert plan.weights_cpu_bytes == next(
        t.n_bytes for t in llama_like.tensors if t.name == "token_embd.weight"
    )
    # one pool: offloading does not change what must fit
    cpu_only = _plan(llama_like, gpu_layers=0, unified_memory=True)
    assert plan.total_bytes == cpu_only.total_bytes


def test_gpu_layers_auto_discrete_fills_vram(llama_like: GGUFInfo) -> None:
    full = _plan(llama_like, gpu_layers=llama_like.n_layer + 1, gpu_available_bytes=64 * GIB)
    per_layer = full.kv_bytes // llama_like.n_layer
    vram = full.compute_bytes + 4 * per_layer + 4 * (full.weights_gpu_bytes // (llama_like.n_layer + 1))
    plan = _plan(llama_like, gpu_layers="auto", gpu_available_bytes=vram)
    assert 0 < plan.n_gpu_layers < llama_like.n_layer + 1
    assert plan.gpu_bytes <= vram
    more = _plan(llama_like, gpu_layers=plan.n_gpu_layers + 1, gpu_available_bytes=vram)
    assert more.gpu_bytes > vram and not more.fits
    # discrete: RAM holds only what stayed on the CPU
    assert plan.total_bytes < _plan(llama_like, gpu_layers=0).total_bytes
    assert plan.kv_gpu_bytes == plan.n_gpu_layers * per_layer


def test_discrete_split_counts_layers_from_the_top(llama_like: GGUFInfo) -> None:
    plan = _plan(llama_like, gpu_layers=2, gpu_available_bytes=64 * GIB)
    top = sum(
        t.n_bytes for t in llama_like.tensors if t.layer is not None and t.layer >= llama_like.n_layer - 2
    )
    assert plan.weights_gpu_bytes == top
    assert plan.weights_cpu_bytes == llama_like.weights_bytes - top


def test_tied_embeddings_are_duplicated_for_a_gpu_head(tmp_path: Path) -> None:
    from tests.ggufgen import RawGGUF, RawTensorSpec

    g = RawGGUF.minimal(n_tensors=1)
    g.tensors.append(RawTensorSpec("token_embd.weight", (32, 16)))
    info = validate_gguf(g.write(tmp_path / "tied.gguf"))
    emb = 32 * 16 * 4
    plan = plan_memory(
        info,
        n_ctx=256,
        n_slots=1,
        kv_type="f16",
        gpu_layers=2,
        available_bytes=GIB,
        reserve_bytes=0,
        unified_memory=True,
    )
    assert plan.weights_gpu_bytes == info.tensors[0].n_bytes + emb
    assert plan.weights_bytes == info.weights_bytes + emb


def test_compute_terms(gemma_like: GGUFInfo, llama_like: GGUFInfo) -> None:
    base = compute_bytes(llama_like, 2048, 4)
    assert compute_bytes(llama_like, 2048, 4, n_outputs_max=4) <= base
    assert compute_bytes(llama_like, 2048, 4, n_ubatch=128) < base
    # without flash attention the KQ matrix grows with the context
    no_fa = compute_bytes(llama_like, 8192, 4, flash_attn=False) - compute_bytes(
        llama_like, 2048, 4, flash_attn=False
    )
    assert no_fa >= 512 * llama_like.n_head * (8192 - 2048) * 4
    # logits dominate with a large vocabulary and full outputs
    assert compute_bytes(gemma_like, 256, 1, n_batch=256, n_ubatch=256) >= gemma_like.n_vocab * 256 * 4


def test_json_keys_exact(llama_like: GGUFInfo) -> None:
    data = _plan(llama_like).to_json()
    assert list(data) == [
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
    ]


def test_explain_names_every_term(gemma_like: GGUFInfo) -> None:
    text = _plan(gemma_like, n_ctx=40960).explain()
    for word in (
        "weights",
        "kv cache",
        "compute",
        "overhead",
        "reserve",
        "total",
        "fits: yes",
        "sliding-window layers keep only",
        "exceeds the 32768 tokens",
    ):
        assert word in text, word


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"kv_type": "q5"}, "kv_type"),
        ({"n_slots": 0}, "slots"),
        ({"n_ctx": 0}, "n_ctx"),
        ({"gpu_layers": -1}, "gpu_layers"),
        ({"gpu_layers": "most"}, "gpu_layers"),
        ({"kv_type": "q8_0", "head16": True}, "kv_type"),
    ],
)
def test_bad_arguments(llama_like: GGUFInfo, tmp_path: Path, kw: dict[str, Any], field: str) -> None:
    model = llama_like
    if kw.pop("head16", False):  # a quantized KV cache needs head sizes in whole 32-element blocks
        model = validate_gguf(write_tiny_model(tmp_path / "h16.gguf", n_embd=64, n_head=4))
    with pytest.raises(ConfigError) as info:
        _plan(model, **kw)
    assert info.value.field == field


def test_a_draft_model_is_planned_beside_the_served_one(llama_like: GGUFInfo, gemma_like: GGUFInfo) -> None:
    from edge.planner import draft_model_bytes

    alone = _plan(llama_like, n_ctx=2048)
    both = _plan(llama_like, n_ctx=2048, draft=gemma_like)
    d = draft_model_bytes(gemma_like, 2048, 4, "f16", 512, 512)
    assert both.draft_bytes == d and both.total_bytes == alone.total_bytes + d
    # its weights and a KV cache of the same cells for the same sequences, at least
    assert d > gemma_like.weights_bytes + _plan(gemma_like, n_ctx=2048).kv_bytes
    assert alone.draft_bytes == 0 and "draft" not in alone.explain() and "draft " in both.explain()
    # the context chosen to fit makes room for the draft model too
    budget = alone.total_bytes
    fitted = _plan(llama_like, n_ctx=None, available_bytes=budget, draft=gemma_like)
    assert fitted.fits and fitted.total_bytes <= budget and fitted.n_ctx < 2048
    # on a discrete GPU with layers offloaded the draft model goes there too
    gpu = _plan(llama_like, n_ctx=2048, gpu_layers=99, gpu_available_bytes=64 * GIB, draft=gemma_like)
    gpu_alone = _plan(llama_like, n_ctx=2048, gpu_layers=99, gpu_available_bytes=64 * GIB)
    assert gpu.gpu_bytes == gpu_alone.gpu_bytes + d
