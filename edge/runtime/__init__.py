"""Runtime: the engine over llama.cpp (with edge/tools/, the only code that imports llama_cpp).

Public API::

    from edge.runtime import Engine, EngineConfig
    with Engine(EngineConfig(Path("model.gguf"), n_ctx=4096, n_slots=4)) as engine:
        print(engine.complete("Hello", max_tokens=32).text)

(`edge.host.loading.build_engine` builds one from settings: model store, GGUF validation
and the memory plan live above the runtime.)

Rooms, by concern: `engine/` (the any-thread API, mailbox, engine thread), `step/` (the
step plan and its executor), `spec/` (speculative decoding), `kv/` (residency and the host
prompt cache), `embed/` (embeddings), `text/` (detokenizer, chat templates) and `llama/`, the
one room that imports llama_cpp (it sets the thread-wait policy first). Importing this
package or `edge.runtime.types` loads no native library and changes no environment.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from edge.runtime.types import (
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
    from edge.runtime.engine.config import EngineConfig
    from edge.runtime.engine.core import Engine
    from edge.runtime.engine.handle import RequestHandle
    from edge.runtime.llama.build import BuildInfo, build_info

__all__ = [
    "BuildInfo",
    "CompletionResult",
    "Engine",
    "EngineConfig",
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
    "build_info",
]

_LAZY = {
    "Engine": "edge.runtime.engine.core",
    "EngineConfig": "edge.runtime.engine.config",
    "RequestHandle": "edge.runtime.engine.handle",
    "BuildInfo": "edge.runtime.llama.build",  # which llama.cpp runs (/api/version, doctor)
    "build_info": "edge.runtime.llama.build",
}


def __getattr__(name: str) -> Any:
    """Load the llama.cpp-backed names on first use, so importing types stays light."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'edge.runtime' has no attribute {name!r}")
