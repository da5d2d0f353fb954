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


def amx_kernels(system_info: str) -> bool:
    """The build carries ggml's AMX matmul, which crashes on prompt batches in 0.3.36: llama.cpp's
    own tools need `--no-repack` there too (the benchmarks' baselines ask for it then only)."""
    return "AMX_INT8 = 1" in system_info


def extra_buffers_default(system_info: str, env: dict[str, str] | None = None) -> bool:
    """Whether weights may go to ggml's extra CPU buffer types (AMX tiles, repacked layouts).

    On for ARM CPUs only (`NEON = 1`), where the repacked Q4_0/IQ4_NL kernels are what makes
    prompt processing fast. Off on x86: on a Xeon with amx_int8 this build's AMX matmul dies
    with SIGSEGV on the first prompt batch, and without AMX (AVX-512, 2 threads) the repacked
    Q4_K layout measured no faster than the mapped one on the catalog models (decode at 1 and 4
    sequences and 1,000-token prompts within 5 %), while it costs what the model host needs:
    repacked weights are private copies, so an evicted model cannot hand its pages to the page
    cache and be mapped back (runtime/kv/residency.py `_pages_only`); its reload parses and
    repacks the file again. `EDGE_LLAMA_EXTRA_BUFFERS=1` turns them on, `=0` off everywhere.
    """
    value = (os.environ if env is None else env).get(EXTRA_BUFFERS_ENV, "").strip()
    if value in ("0", "1"):
        return value == "1"
    return "NEON = 1" in system_info and not amx_kernels(system_info)


@functools.lru_cache(maxsize=1)
def probe_backends() -> BackendInfo:
    """Inspect the installed build once per process (importing llama_cpp loads the libraries)."""
    try:
        from edge.runtime.llama import llama_cpp
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
