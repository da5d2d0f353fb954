"""Which llama.cpp edge runs: the bindings' version, llama.cpp's commit and build, the backends.

When an answer changes after an upgrade, the first question is what exactly was running, so
`/api/version`, `/v1/status`, `edge doctor` and the deployment records all name it from here.
llama-cpp-python vendors llama.cpp and exports ggml's own `ggml_version()` / `ggml_commit()`
(the vendored tree's git commit, "-dirty" when patched); llama.cpp's build *number* (the `bNNNN`
tag) lives only in its `common` library, which the wheel does not ship, so it is "unknown"
unless the build says otherwise.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import asdict, dataclass
from typing import Any

from edge.runtime.llama.backend import compiled_backends, probe_backends

UNKNOWN = "unknown"


@dataclass(frozen=True)
class BuildInfo:
    """What the installed llama.cpp build is; every field a string a person can quote."""

    llama_cpp_python: str  # the bindings' version, e.g. "0.3.36"
    llama_cpp_build: str  # llama.cpp's build number ("b6123"), or "unknown"
    llama_cpp_commit: str  # the vendored llama.cpp commit ("0c1e570-dirty"), or "unknown"
    ggml_version: str  # ggml's own version ("0.25.3"), or "unknown"
    backends: tuple[str, ...]  # compiled in: cpu, cuda, metal, vulkan, blas
    error: str | None = None  # why llama_cpp could not be inspected

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "backends": list(self.backends)}

    def line(self) -> str:
        """One line for a log or a terminal."""
        if self.error:
            return f"llama-cpp-python unavailable ({self.error})"
        return (f"llama-cpp-python {self.llama_cpp_python}, llama.cpp build {self.llama_cpp_build} "
                f"(commit {self.llama_cpp_commit}, ggml {self.ggml_version}), "
                f"backends {', '.join(self.backends) or 'none'}")


def _ggml_string(lib: Any, name: str) -> str:
    """A `const char *(void)` of ggml's, or "unknown" when this build lacks it."""
    try:
        fn = getattr(lib, name)
    except AttributeError:
        return UNKNOWN
    fn.restype, fn.argtypes = ctypes.c_char_p, []
    raw = fn()
    return raw.decode("utf-8", "replace") if raw else UNKNOWN


def _binding_version() -> str:
    """The installed llama-cpp-python's version (edge loads its bindings without the package's
    `__init__`, which is where `llama_cpp.__version__` is set)."""
    from importlib import metadata

    try:
        return metadata.version("llama_cpp_python")
    except metadata.PackageNotFoundError:  # run from a source tree on sys.path
        return UNKNOWN


@functools.lru_cache(maxsize=1)
def build_info() -> BuildInfo:
    """Inspect the installed build once per process; never raises (a broken install is reported)."""
    backends = probe_backends()
    if backends.error is not None:
        return BuildInfo(UNKNOWN, UNKNOWN, UNKNOWN, UNKNOWN, (), error=backends.error)
    try:
        from llama_cpp import _ggml

        lib: Any = _ggml.libggml
    except Exception:  # an older binding without the ggml module: version and commit unknown
        lib = None
    return BuildInfo(
        llama_cpp_python=_binding_version(),
        llama_cpp_build=UNKNOWN,  # see the module docstring
        llama_cpp_commit=_ggml_string(lib, "ggml_commit") if lib is not None else UNKNOWN,
        ggml_version=_ggml_string(lib, "ggml_version") if lib is not None else UNKNOWN,
        backends=compiled_backends(backends),
    )
