"""`edge quantize`: the refusals that come before llama.cpp's quantizer runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from edge.cli import main as edge_main
from edge.tools.quantize import FTYPES, ftype_of
from tests.ggufgen import write_tiny_model


def test_type_names() -> None:
    assert {"F16", "Q8_0", "Q4_0", "Q4_K_M"} <= set(FTYPES)
    assert ftype_of("q8_0") == FTYPES["Q8_0"] != FTYPES["Q4_0"]


def test_unknown_type_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = write_tiny_model(tmp_path / "tiny.gguf")
    assert edge_main(["quantize", str(src), str(tmp_path / "out.gguf"), "--type", "Q9_9"]) == 2
    assert "unknown quantization type 'Q9_9'" in capsys.readouterr().err
    assert not (tmp_path / "out.gguf").exists()


def test_existing_destination_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = write_tiny_model(tmp_path / "tiny.gguf")
    dst = tmp_path / "out.gguf"
    dst.write_bytes(b"keep me")
    assert edge_main(["quantize", str(src), str(dst), "--type", "Q8_0"]) == 2
    assert "pass --force" in capsys.readouterr().err and dst.read_bytes() == b"keep me"
    # --force never overwrites the source itself
    assert edge_main(["quantize", str(src), str(src), "--dequantize", "--force"]) == 2


def test_missing_source_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert edge_main(["quantize", str(tmp_path / "none.gguf"), str(tmp_path / "o.gguf"), "--type", "Q8_0",
                      "--models-dir", str(tmp_path)]) == 2
    assert "model not found" in capsys.readouterr().err


def test_type_or_dequantize_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        edge_main(["quantize", "a.gguf", "b.gguf"])
    assert exc.value.code == 2 and "--type" in capsys.readouterr().err


def test_dequantize_writes_f16(tmp_path: Path) -> None:
    from gguf import GGMLQuantizationType, GGUFReader

    src = write_tiny_model(tmp_path / "tiny.gguf", weight_type=GGMLQuantizationType.Q8_0, file_type=7)
    assert edge_main(["quantize", str(src), str(tmp_path / "f16.gguf"), "--dequantize"]) == 0
    reader = GGUFReader(tmp_path / "f16.gguf")
    assert reader.fields["general.file_type"].contents() == 1
    assert {t.tensor_type.name for t in reader.tensors} <= {"F16", "F32"}
    assert not list(tmp_path.glob("*.partial"))
