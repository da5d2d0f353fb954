"""Everything one app instance owns: engine, admission, metrics, in-flight requests.

Held in `app.state.edge` (one per `create_app` call), never in module globals,
so tests can build many apps side by side.

Server lifecycle as /ready reports it (the engine has its own EngineState):
SERVING -> DRAINING (first SIGTERM: no new requests) -> STOPPED.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from edge.api.metrics import ApiMetrics
from edge.config import Settings
from edge.errors import ModelNotFound
from edge.runtime.types import EngineLike, EngineState, RequestHandleLike
from edge.scheduler.admission import AdmissionLike
from edge.scheduler.loop import SchedulerLike


class ServerState(str, Enum):
    SERVING = "serving"
    DRAINING = "draining"
    STOPPED = "stopped"


@dataclass
class ApiState:
    settings: Settings
    engine: EngineLike
    admission: AdmissionLike
    metrics: ApiMetrics
    model_id: str
    model_names: frozenset[str]
    api_key: str | None
    scheduler: SchedulerLike | None = None
    plan: Any = None
    clock: Callable[[], float] = time.perf_counter
    started_unix_s: float = field(default_factory=time.time)
    server_state: ServerState = ServerState.SERVING
    in_flight: dict[str, RequestHandleLike] = field(default_factory=dict)
    embeds_in_flight: int = 0  # /v1/embeddings requests queued or running (bounded there)
    model_path: Path | None = None  # the served GGUF file (Ollama's /api/show, /api/tags); None: unknown
    ollama_cache: dict[str, Any] = field(default_factory=dict)  # model facts read once (api/ollama_models)

    def check_model(self, name: str) -> None:
        if name not in self.model_names:
            raise ModelNotFound(name, f"this server serves {self.model_id!r}")

    def scheduler_status(self) -> dict[str, Any] | None:
        return None if self.scheduler is None else self.scheduler.status()

    def readiness(self) -> tuple[bool, str]:
        """(ready, reason): not ready while loading, draining, paused or failed."""
        if self.server_state is not ServerState.SERVING:
            return False, f"server {self.server_state.value}"
        state = self.engine.state
        if state is EngineState.READY:
            try:
                if self.engine.stats().knobs.paused:
                    return False, "paused by the scheduler (device hot or short of memory)"
            except Exception:
                return False, "engine stats unavailable"
            return True, "ready"
        if state is EngineState.UNLOADED:
            return True, "model unloaded after idle keep-alive; reloads on the next request"
        if state is EngineState.LOADING:
            return False, "loading model"
        if state is EngineState.PAUSED:
            return False, "paused by the scheduler (device hot or short of memory)"
        return False, f"engine {state.value}"

    # --- in-flight bookkeeping (used by drain) --------------------------
    def track(self, request_id: str, handle: RequestHandleLike) -> None:
        self.in_flight[request_id] = handle

    def untrack(self, request_id: str) -> None:
        self.in_flight.pop(request_id, None)

    def begin_drain(self) -> None:
        self.server_state = ServerState.DRAINING

    def cancel_all(self) -> int:
        handles = list(self.in_flight.values())
        for h in handles:
            h.cancel()
        return len(handles)
