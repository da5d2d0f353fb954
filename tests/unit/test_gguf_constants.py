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
