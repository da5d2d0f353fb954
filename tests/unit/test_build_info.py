"""What is running: the llama.cpp build as the runtime reports it, and where the server says it."""

from __future__ import annotations

import ctypes
from importlib.metadata import version
from types import SimpleNamespace
from typing import Any

from fastapi.testclient import TestClient

import edge
from edge.runtime import build_info
from edge.runtime.llama.backend import BackendInfo, compiled_backends
from edge.runtime.llama.build import UNKNOWN, BuildInfo, _ggml_string
from tests.fakes import make_app


def test_the_installed_build_is_named() -> None:
    b = build_info()
    assert b.error is None
    assert b.llama_cpp_python == version("llama_cpp_python")
    assert b.llama_cpp_commit not in ("", UNKNOWN) and b.ggml_version not in ("", UNKNOWN)
    assert b.llama_cpp_build == UNKNOWN  # the wheel carries no build number: said so, not guessed
    assert b.backends[0] == "cpu"
    assert set(b.to_dict()) == {"llama_cpp_python", "llama_cpp_build", "llama_cpp_commit", "ggml_version",
                                "backends", "error"}
    assert f"commit {b.llama_cpp_commit}" in b.line()


class _Fn:
    def __init__(self, value: bytes | None) -> None:
        self.value = value
        self.restype: Any = None
        self.argtypes: Any = None

    def __call__(self) -> bytes | None:
        assert self.restype is ctypes.c_char_p  # never read a char * as an int
        return self.value


def test_a_build_without_the_ggml_functions_says_unknown() -> None:
    assert _ggml_string(SimpleNamespace(), "ggml_commit") == UNKNOWN
    assert _ggml_string(SimpleNamespace(ggml_commit=_Fn(None)), "ggml_commit") == UNKNOWN
    assert _ggml_string(SimpleNamespace(ggml_commit=_Fn(b"0c1e570")), "ggml_commit") == "0c1e570"


def test_compiled_backends_from_libraries_and_system_info() -> None:
    def info(libs: tuple[str, ...], system_info: str, error: str | None = None) -> BackendInfo:
        return BackendInfo("0.3", True, False, False, False, False, system_info, libs, error=error)

    assert compiled_backends(info(("libggml-cuda.so", "libggml-cpu.so"), "")) == ("cuda", "cpu")
    assert compiled_backends(info((), "Metal : EMBED_LIBRARY = 1 | CPU : NEON = 1")) == ("metal", "cpu")
    assert compiled_backends(info((), "", error="no llama_cpp")) == ()
    broken = BuildInfo(UNKNOWN, UNKNOWN, UNKNOWN, UNKNOWN, (), error="no llama_cpp")
    assert broken.line() == "llama-cpp-python unavailable (no llama_cpp)"


def test_api_version_and_status_name_the_build() -> None:
    app, _ = make_app()
    client = TestClient(app)
    want = {"edge_version": edge.__version__, **build_info().to_dict()}
    v = client.get("/api/version").json()
    assert v["version"] and {k: v[k] for k in want} == want
    assert client.get("/v1/status").json()["build"] == want
