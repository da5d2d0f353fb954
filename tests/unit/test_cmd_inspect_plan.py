"""`edge inspect` and `edge plan` through the real CLI entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edge.cli import main
from edge.gguf import validate_gguf
from tests.ggufgen import write_tiny_model

GIB = 1 << 30


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return write_tiny_model(
        tmp_path / "tiny.gguf",
        arch="gemma3",
        n_layer=6,
        n_embd=64,
        n_head=4,
        n_head_kv=1,
        head_dim=64,
        sliding_window=64,
        n_ctx_train=4096,
        chat_template="{{ bos_token }}",
    )


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_inspect_text(model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(capsys, "inspect", str(model))
    assert rc == 0
    assert "architecture    gemma3" in out
    assert "layers          6" in out
    assert "kv heads        1" in out
    assert "sliding window  64 tokens on 5 of 6 layers" in out
    assert "chat template   yes" in out
    info = validate_gguf(model)
    assert f"{info.kv_bytes_per_token('f16')} B (f16), {info.kv_bytes_per_token('q8_0')} B (q8_0)" in out


def test_inspect_json_and_tensors(model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(capsys, "inspect", str(model), "--json", "--tensors")
    assert rc == 0
    data = json.loads(out)
    assert data["architecture"] == "gemma3" and data["n_layer"] == 6 and data["n_head_kv"] == 1
    assert data["sliding_window"] == 64 and data["swa_layers"] == [0, 1, 2, 3, 4]
    assert data["chat_template"] is True
    assert len(data["tensors"]) == data["n_tensors"] == 6 * 9 + 3
    assert sum(t["n_bytes"] for t in data["tensors"]) == data["weights_bytes"]


def test_inspect_missing_and_unknown_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = _run(capsys, "inspect", str(tmp_path / "missing.gguf"))
    assert rc == 2 and err.startswith("edge: error: model not found") and len(err.strip().splitlines()) == 1
    rc, _, err = _run(capsys, "inspect", "no-such-model", "--models-dir", str(tmp_path))
    assert rc == 2 and "model not found: no-such-model" in err and len(err.strip().splitlines()) == 1


def test_plan_json_with_memory_suffix(model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(
        capsys,
        "plan",
        str(model),
        "--json",
        "--memory",
        "1.5GiB",
        "--profile",
        "generic-x86-cpu",
        "--ctx",
        "1000",
        "--slots",
        "2",
        "--kv-type",
        "q8_0",
    )
    assert rc == 0
    data = json.loads(out)
    assert data["available_bytes"] == int(1.5 * GIB)
    assert data["n_ctx"] == 1024 and data["kv_type"] == "q8_0" and data["n_gpu_layers"] == 0
    assert data["reserve_bytes"] == 2 * GIB  # from the generic-x86-cpu profile
    assert data["fits"] is False  # 1.5 GiB minus a 2 GiB reserve
    assert set(data) == {
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
    }
    assert data["draft_bytes"] == 0


def test_plan_text_explains_and_picks_context(model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(
        capsys,
        "plan",
        str(model),
        "--memory",
        "4G",
        "--reserve",
        "512M",
        "--profile",
        "jetson-orin-nano",
    )
    assert rc == 0
    assert "fits: yes" in out
    assert "keys and values for 4096 context tokens" in out  # capped at n_ctx_train
    assert "one pool shared by CPU and GPU" in out  # unified memory profile
    assert "7 of 7 layers" in out  # gpu_layers auto on a unified-memory profile


@pytest.mark.parametrize(
    ("flag", "value", "fragment"),
    [
        ("--ctx", "abc", "--ctx: not an integer"),
        ("--ctx", "0", "--ctx: must be at least 1"),
        ("--slots", "-2", "--slots: must be at least 1"),
        ("--memory", "lots", "--memory: not a size"),
        ("--gpu-layers", "many", "--gpu-layers: expected a layer count or 'auto'"),
        ("--kv-type", "q5_1", "--kv-type: 'q5_1' is not one of"),
        ("--profile", "toaster", "unknown profile 'toaster'"),
    ],
)
def test_plan_bad_input_is_one_line_exit_2(
    model: Path, capsys: pytest.CaptureFixture[str], flag: str, value: str, fragment: str
) -> None:
    rc, _, err = _run(capsys, "plan", str(model), "--memory", "4G", flag, value)
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("edge: error:") and fragment in lines[0], err


def test_plan_malformed_and_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 16)
    rc, _, err = _run(capsys, "plan", str(bad), "--memory", "1G")
    assert rc == 2 and "invalid GGUF file" in err and len(err.strip().splitlines()) == 1
    rc, _, err = _run(capsys, "plan", str(tmp_path), "--memory", "1G")
    assert rc == 2 and "is a directory" in err


def test_plan_with_a_draft_model_counts_it(model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(capsys, "plan", str(model), "--json", "--memory", "64G", "--ctx", "1024")
    alone = json.loads(out)
    rc2, out2, _ = _run(capsys, "plan", str(model), "--json", "--memory", "64G", "--ctx", "1024",
                        "--draft-model", str(model))
    both = json.loads(out2)
    assert rc == rc2 == 0 and both["draft_bytes"] > alone["weights_bytes"]
    assert both["total_bytes"] - both["draft_bytes"] >= alone["total_bytes"]  # + the verify rows' logits
