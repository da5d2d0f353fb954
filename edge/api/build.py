"""What is running, as `/api/version` and `/v1/status` name it: edge's version and the llama.cpp
build under it (`edge.runtime.build_info`: bindings, commit, build number, backends compiled in).

When answers change after an upgrade, the running server itself says which build it is."""

from __future__ import annotations

from typing import Any

from edge import __version__


def running() -> dict[str, Any]:
    """{"edge_version", "llama_cpp_python", "llama_cpp_build", "llama_cpp_commit", "ggml_version",
    "backends", "error"}; inspected once per process, never raises."""
    from edge.runtime import build_info

    return {"edge_version": __version__, **build_info().to_dict()}
