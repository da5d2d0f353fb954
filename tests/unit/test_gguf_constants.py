"""edge.gguf reads gguf-py's tables without importing the gguf package (edge/gguf/constants.py)."""

from __future__ import annotations

import subprocess
import sys

import gguf

from edge.gguf import constants


def test_the_tables_are_gguf_pys_own() -> None:
    assert {int(t): v for t, v in constants.GGML_QUANT_SIZES.items()} == {
        int(t): v for t, v in gguf.GGML_QUANT_SIZES.items()}
    names = [(t.name, int(t)) for t in constants.LlamaFileType]
    assert names == [(t.name, int(t)) for t in gguf.LlamaFileType]
    assert constants.GGMLQuantizationType.Q4_K == gguf.GGMLQuantizationType.Q4_K  # IntEnums: compare by value


def test_reading_a_model_file_imports_neither_the_gguf_package_nor_numpy() -> None:
    code = "import sys, edge.gguf; print(sorted(m for m in ('gguf', 'numpy', 'yaml') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_tables_load_on_first_use_not_on_import() -> None:
    """Building gguf-py's enums costs a start 11-17 ms; a file checked before needs none of them."""
    code = ("import edge.gguf; from edge.gguf import constants as c; before = 'LlamaFileType' in vars(c); "
            "n = len(c.GGML_QUANT_SIZES); print(before, 'LlamaFileType' in vars(c), n > 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "True", "True"]


def test_an_unknown_table_name_is_an_attribute_error() -> None:
    try:
        constants.MODEL_ARCH  # noqa: B018 - a name edge does not take from gguf-py
    except AttributeError as exc:
        assert "MODEL_ARCH" in str(exc)
    else:
        raise AssertionError("no AttributeError")
