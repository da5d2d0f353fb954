"""Model facts from GGUFWriter-written files match what was written."""

from __future__ import annotations

from pathlib import Path

import pytest
from gguf import GGMLQuantizationType

from edge.errors import InvalidGGUF
from edge.gguf import info_to_json, kv_row_bytes, validate_gguf
from tests.ggufgen import write_tiny_model


def test_llama_like_gqa_model_facts(tmp_path: Path) -> None:
    path = write_tiny_model(
        tmp_path / "m.gguf",
        n_layer=3,
        n_embd=64,
        n_head=8,
        n_head_kv=2,
        n_ff=96,
        n_vocab=50,
        n_ctx_train=2048,
        chat_template="{{ messages }}",
    )
    info = validate_gguf(path)
    assert info.architecture == "llama"
    assert info.name == "tiny-llama"
    assert (info.n_layer, info.n_head, info.n_head_kv, info.n_embd, info.n_ff) == (3, 8, 2, 64, 96)
    assert info.head_dim_k == info.head_dim_v == 8  # n_embd / n_head
    assert info.n_ctx_train == 2048
    assert info.sliding_window is None and not any(info.swa_layers)
    assert info.chat_template == "{{ messages }}"
    assert info.license == "apache-2.0"
    assert info.tokenizer_model == "gpt2"
    assert (info.n_vocab, info.bos_token_id, info.eos_token_id) == (50, 1, 2)
    assert info.file_type == "MOSTLY_F16"
    # per layer: 9 tensors; plus token_embd, output_norm, output
    assert len(info.tensors) == 3 * 9 + 3
    assert info.quant_mix == {"F16": 3 * 7 + 2, "F32": 3 * 2 + 1}
    expected_params = 50 * 64 * 2 + 64 + 3 * (64 * 2 + 64 * 64 * 2 + 16 * 64 * 2 + 96 * 64 * 3)
    assert info.n_params == expected_params
    assert info.weights_bytes == sum(t.n_bytes for t in info.tensors)
    blk1 = [t for t in info.tensors if t.layer == 1]
    assert len(blk1) == 9 and all(t.name.startswith("blk.1.") for t in blk1)
    k = next(t for t in info.tensors if t.name == "blk.0.attn_k.weight")
    assert k.shape == (64, 16) and k.n_bytes == 64 * 16 * 2
    # KV per token: 3 layers × (K + V) × 2 heads × 8 dims × 2 bytes
    assert info.kv_bytes_per_token("f16") == 3 * 2 * 16 * 2


def test_kv_bytes_per_token_quantized_types(tmp_path: Path) -> None:
    info = validate_gguf(write_tiny_model(tmp_path / "m.gguf", n_layer=2, n_head=4, n_head_kv=4, head_dim=64))
    width = 4 * 64  # n_embd_k_gqa
    assert info.kv_bytes_per_token("f16") == 2 * 2 * width * 2
    assert info.kv_bytes_per_token("q8_0") == 2 * 2 * (width // 32) * 34
    assert info.kv_bytes_per_token("q4_0") == 2 * 2 * (width // 32) * 18
    assert kv_row_bytes("q8_0", 33) == 2 * 34  # partial blocks round up
    with pytest.raises(ValueError, match="unknown KV type"):
        kv_row_bytes("q3", 32)


def test_gemma3_sliding_window_pattern(tmp_path: Path) -> None:
    info = validate_gguf(
        write_tiny_model(tmp_path / "g.gguf", arch="gemma3", n_layer=12, sliding_window=128, head_dim=32)
    )
    assert info.sliding_window == 128
    # llama.cpp gemma3: layer il is SWA unless (il + 1) % 6 == 0
    assert [il for il, swa in enumerate(info.swa_layers) if not swa] == [5, 11]
    assert info.n_swa_layers == 10
    assert info.kv_bytes_per_token("f16", swa=False) * 5 == info.kv_bytes_per_token("f16", swa=True)


def test_explicit_pattern_period_and_array(tmp_path: Path) -> None:
    period = validate_gguf(
        write_tiny_model(tmp_path / "p.gguf", arch="gemma3", n_layer=6, sliding_window=64, swa_pattern=3)
    )
    assert period.swa_layers == (True, True, False, True, True, False)
    flags = [True, False, False, True, False, True]
    array = validate_gguf(
        write_tiny_model(tmp_path / "a.gguf", arch="gemma3", n_layer=6, sliding_window=64, swa_pattern=flags)
    )
    assert list(array.swa_layers) == flags


def test_unknown_architecture_with_window_keeps_full_cache(tmp_path: Path) -> None:
    info = validate_gguf(write_tiny_model(tmp_path / "x.gguf", arch="phi3", n_layer=4, sliding_window=256))
    assert info.sliding_window == 256
    assert not any(info.swa_layers)  # llama.cpp would not shrink these layers; neither does the plan


def test_per_layer_kv_heads(tmp_path: Path) -> None:
    info = validate_gguf(write_tiny_model(tmp_path / "h.gguf", n_layer=4, n_head=4, n_head_kv=[1, 2, 4, 2]))
    assert info.n_head_kv == (1, 2, 4, 2)
    assert [info.n_embd_k_gqa(il) for il in range(4)] == [16, 32, 64, 32]
    assert info.kv_bytes_per_token("f16") == (16 + 32 + 64 + 32) * 2 * 2


def test_quantized_weights_and_file_type(tmp_path: Path) -> None:
    info = validate_gguf(
        write_tiny_model(tmp_path / "q.gguf", weight_type=GGMLQuantizationType.Q8_0, file_type=7, n_embd=64)
    )
    assert info.file_type == "MOSTLY_Q8_0"
    assert info.quant_mix["Q8_0"] == 2 * 7 + 2
    emb = next(t for t in info.tensors if t.name == "token_embd.weight")
    assert emb.ggml_type == "Q8_0" and emb.n_bytes == 64 * 64 // 32 * 34


def test_json_has_stable_keys(tmp_path: Path) -> None:
    info = validate_gguf(
        write_tiny_model(tmp_path / "g.gguf", arch="gemma3", n_layer=6, sliding_window=64, head_dim=32)
    )
    data = info_to_json(info)
    assert set(data) == {
        "path",
        "file_size_bytes",
        "gguf_version",
        "architecture",
        "name",
        "n_params",
        "file_type",
        "quant_mix",
        "n_tensors",
        "weights_bytes",
        "n_layer",
        "n_head",
        "n_head_kv",
        "n_embd",
        "n_ff",
        "head_dim_k",
        "head_dim_v",
        "n_ctx_train",
        "sliding_window",
        "swa_layers",
        "kv_bytes_per_token",
        "chat_template",
        "license",
        "tokenizer_model",
        "n_vocab",
        "bos_token_id",
        "eos_token_id",
    }
    assert data["swa_layers"] == [0, 1, 2, 3, 4]
    assert data["chat_template"] is False
    assert data["kv_bytes_per_token"]["q8_0"] == info.kv_bytes_per_token("q8_0")


def test_missing_block_count_is_invalid(tmp_path: Path) -> None:
    from tests.ggufgen import RawGGUF

    g = RawGGUF.minimal()
    g.kvs = [kv for kv in g.kvs if kv[0] != "llama.block_count"]
    with pytest.raises(InvalidGGUF, match=r"missing required key 'llama\.block_count'"):
        validate_gguf(g.write(tmp_path / "m.gguf"))
