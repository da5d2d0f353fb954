"""llama.cpp bindings: the one room of the runtime that imports `llama_cpp`.

OpenMP reads its thread-wait policy once, when llama_cpp loads its native libraries, so this
package sets it (threads.py) before the import; every other room takes `llama_cpp` from here
(`from edge.runtime.llama import llama_cpp`), which keeps that order whatever imports first.

`llama_cpp` here is the ctypes module `llama_cpp.llama_cpp`, the low-level API and all edge
calls. The package's own `__init__` also imports the high-level `Llama` class and with it
numpy, jinja2, diskcache, multiprocessing and the chat formats: 0.10-0.13 s of every start
on the critical path, for nothing edge uses. So the package is registered without running
its `__init__`; the first use of a name only the full package has (`from llama_cpp import
Llama`, a test's reference model) runs it then, in place, so other code sees the usual package.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
import threading
from types import ModuleType
from typing import Any

from edge.runtime.llama.threads import apply_wait_policy

WAIT_POLICY = apply_wait_policy()

_COMPLETE = threading.RLock()  # the real __init__ may look names up while it runs


def _register_package() -> None:
    """Put `llama_cpp` in sys.modules without its `__init__`, completed on first foreign use."""
    if "llama_cpp" in sys.modules:
        return
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or spec.loader is None:
        raise ImportError("llama-cpp-python is not installed", name="llama_cpp")
    package = importlib.util.module_from_spec(spec)
    loader = spec.loader
    done: list[bool] = []

    def __getattr__(name: str) -> Any:  # PEP 562: only names the package lacks come here
        if importlib.machinery.PathFinder.find_spec(name, package.__path__) is not None:
            # a submodule (`from llama_cpp import _ggml` asks first): the import system loads it
            raise AttributeError(f"module 'llama_cpp' has no attribute {name!r}")
        with _COMPLETE:
            if not done:
                done.append(True)
                loader.exec_module(package)  # the real __init__, into this same module object
        if name in package.__dict__:
            return package.__dict__[name]
        raise AttributeError(f"module 'llama_cpp' has no attribute {name!r}")

    package.__getattr__ = __getattr__  # type: ignore[method-assign]
    sys.modules["llama_cpp"] = package


_register_package()
llama_cpp: ModuleType = importlib.import_module("llama_cpp.llama_cpp")

__all__ = ["WAIT_POLICY", "llama_cpp"]
