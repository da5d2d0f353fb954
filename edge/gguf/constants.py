"""gguf-py's `constants` module, loaded without the `gguf` package's `__init__`.

The package's `__init__` imports its reader, writer, vocabulary and metadata tools (numpy,
yaml: ~40 ms of `edge serve`'s start on a 2-core VM) for the three tables edge reads from it
(quantization block sizes, their names, file types). `constants.py` imports nothing but the
standard library, so it is loaded on its own, from the installed package's own file: gguf-py
stays the one source of those tables. Where `gguf` is already imported, its module is used.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def _load() -> ModuleType:
    loaded = sys.modules.get("gguf.constants")
    if loaded is not None:
        return loaded
    spec = importlib.util.find_spec("gguf")  # finds the package without running its __init__
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the gguf package is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / "constants.py"
    own = importlib.util.spec_from_file_location("edge.gguf._gguf_constants", path)
    assert own is not None and own.loader is not None
    module = importlib.util.module_from_spec(own)
    own.loader.exec_module(module)
    return module


_constants = _load()
GGML_QUANT_SIZES: dict = _constants.GGML_QUANT_SIZES
GGMLQuantizationType = _constants.GGMLQuantizationType
LlamaFileType = _constants.LlamaFileType
