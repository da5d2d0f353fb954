"""Runtime: the only package that imports llama_cpp.

Public API::

    from edge.runtime import Engine
    with Engine("model.gguf", n_ctx=4096, n_slots=4) as engine:
        print(engine.complete("Hello", max_tokens=32).text)

Submodules that do not need the native library (types, slots, detok, handle,
chat_template) import nothing from llama_cpp, so `edge.runtime.types` stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from edge.runtime.threads import apply_wait_policy

# OpenMP reads its wait policy once, when llama_cpp loads its native libraries; every submodule
# that imports llama_cpp runs this package's __init__ first, so this is always early enough.
WAIT_POLICY = apply_wait_policy()

from edge.runtime.types import (  # noqa: E402
    CompletionResult,
    EngineState,
    EngineStats,
    FinishReason,
    GenerationRequest,
    Knobs,
    Priority,
    SamplingParams,
    TokenEvent,
    Usage,
)

if TYPE_CHECKING:
    from edge.runtime.engine import Engine
    from edge.runtime.handle import RequestHandle

__all__ = [
    "CompletionResult",
    "Engine",
    "EngineState",
    "EngineStats",
    "FinishReason",
    "GenerationRequest",
    "Knobs",
    "Priority",
    "RequestHandle",
    "SamplingParams",
    "TokenEvent",
    "Usage",
]

_LAZY = {
    "Engine": "edge.runtime.engine",
    "RequestHandle": "edge.runtime.handle",
}


def __getattr__(name: str) -> Any:
    """Load the llama.cpp-backed classes on first use, so importing types stays light."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'edge.runtime' has no attribute {name!r}")
