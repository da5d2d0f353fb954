"""gguf-py's `constants` module, loaded without the `gguf` package's `__init__`.

The package's `__init__` imports its reader, writer, vocabulary and metadata tools (numpy,
yaml: ~40 ms of `edge serve`'s start on a 2-core VM) for the three tables edge reads from it
(quantization block sizes, their names, file types). `constants.py` imports nothing but the
standard library, so it is loaded on its own, from the installed package's own file: gguf-py
stays the one source of those tables. Where `gguf` is already imported, its module is used.

The module is executed on first use of a table (PEP 562), not when edge.gguf is imported: its
enums of architectures and tensor names take 11-17 ms to build, and a start whose model files
were checked before (checked.py) reads none of the tables.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

_NAMES = ("GGML_QUANT_SIZES", "GGMLQuantizationType", "LlamaFileType")
_LOCK = threading.Lock()


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


def __getattr__(name: str) -> Any:
    """The tables, from gguf-py's module, loaded once on first use of any of them."""
    if name not in _NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    with _LOCK:
        if name not in globals():
            module = _load()
            globals().update({n: getattr(module, n) for n in _NAMES})
    return globals()[name]
