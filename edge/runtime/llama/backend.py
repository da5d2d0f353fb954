"""Which ggml backends this llama-cpp-python build has.

A wheel built for CPU silently runs everything on the CPU even when a Jetson's
GPU is right there, so `edge doctor` reports what the build really contains:
the shared libraries shipped next to the bindings, llama.cpp's system-info
string and `llama_supports_gpu_offload()`.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

_BACKEND_LIBS = {
    "cuda": ("libggml-cuda",),
    "metal": ("libggml-metal",),
    "vulkan": ("libggml-vulkan",),
    "blas": ("libggml-blas",),
    "cpu": ("libggml-cpu", "libggml"),
}


@dataclass(frozen=True)
class BackendInfo:
    llama_cpp_version: str | None
    has_cpu: bool
    has_cuda: bool
    has_metal: bool
    has_blas: bool
    gpu_offload: bool
    system_info: str
    libraries: tuple[str, ...]
    error: str | None = None  # set when llama_cpp cannot be imported
    cpu_extra_buffers: bool = True  # weights may use ggml's AMX/repacked CPU buffers (see below)


def _libraries(lib_dir: Path) -> tuple[str, ...]:
    if not lib_dir.is_dir():
        return ()
    return tuple(sorted(p.name for p in lib_dir.iterdir() if ".so" in p.name or p.suffix == ".dylib"))


def _has(libs: tuple[str, ...], system_info: str, kind: str) -> bool:
    if any(lib.startswith(prefix) for lib in libs for prefix in _BACKEND_LIBS[kind]):
        return True
    return f"{kind.upper()} :" in system_info.upper()


def compiled_backends(info: BackendInfo) -> tuple[str, ...]:
    """Names of the backends the build carries (cpu always; none when llama_cpp is broken)."""
    if info.error is not None:
        return ()
    return tuple(k for k in _BACKEND_LIBS if k == "cpu" or _has(info.libraries, info.system_info, k))


EXTRA_BUFFERS_ENV = "EDGE_LLAMA_EXTRA_BUFFERS"  # "1"/"0" overrides extra_buffers_default()


def extra_buffers_default(system_info: str, env: dict[str, str] | None = None) -> bool:
    """Whether weights may go to ggml's extra CPU buffer types (AMX tiles, repacked layouts).

    Off where the build carries ggml's AMX kernels: in llama-cpp-python 0.3.36 built on a
    Xeon with amx_int8, the first batch of more than one token (any prompt) dies with
    SIGSEGV in ggml_backend_amx_mul_mat (SmolLM2-135M Q4_1). Plain CPU kernels are correct
    and ran 150 prompt tokens/s on 2 threads there. `EDGE_LLAMA_EXTRA_BUFFERS=1` turns them
    back on (for a fixed llama.cpp), `=0` off everywhere.
    """
    value = (os.environ if env is None else env).get(EXTRA_BUFFERS_ENV, "").strip()
    if value in ("0", "1"):
        return value == "1"
    return "AMX_INT8 = 1" not in system_info


@functools.lru_cache(maxsize=1)
def probe_backends() -> BackendInfo:
    """Inspect the installed build once per process (importing llama_cpp loads the libraries)."""
    try:
        import llama_cpp
    except Exception as exc:  # ImportError, or OSError from a broken shared library
        return BackendInfo(None, False, False, False, False, False, "", (), error=str(exc))
    llama_cpp.llama_backend_init()
    raw = llama_cpp.llama_print_system_info()
    system_info = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    libs = _libraries(Path(llama_cpp.__file__).parent / "lib")
    return BackendInfo(
        llama_cpp_version=getattr(llama_cpp, "__version__", None),
        has_cpu=True,  # every build carries the CPU backend
        has_cuda=_has(libs, system_info, "cuda"),
        has_metal=_has(libs, system_info, "metal"),
        has_blas=_has(libs, system_info, "blas"),
        gpu_offload=bool(llama_cpp.llama_supports_gpu_offload()),
        system_info=system_info.strip(),
        libraries=libs,
        cpu_extra_buffers=extra_buffers_default(system_info),
    )
