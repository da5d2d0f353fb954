"""Everything one app instance owns: engine, admission, metrics, in-flight requests.

Held in `app.state.edge` (one per `create_app` call), never in module globals,
so tests can build many apps side by side.

Server lifecycle as /ready reports it (the engine has its own EngineState):
SERVING -> DRAINING (first SIGTERM: no new requests) -> STOPPED.

/ready means "send me work": 503 while draining, loading, past a thermal, memory or
power limit, or with a full queue, each with a typed `ReadyReason`. The HAProxy
agent check (edge.service.agent) answers from `balancer_weight()`, built on the same.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import Any

import anyio

from edge.api.audit import tally
from edge.api.leases import lease_list
from edge.api.metrics import ApiMetrics
from edge.api.probe_record import ProbeRecord
from edge.api.response_store import ResponseStore
from edge.config import Settings
from edge.errors import ModelNotFound
from edge.host.models import Lease, ModelHost
from edge.host.names import ModelRef
from edge.runtime.types import EngineLike, EngineState, RequestHandleLike
from edge.scheduler.admission import AdmissionLike
from edge.scheduler.headroom import AgentWeight, agent_weight
from edge.scheduler.loop import SchedulerLike
from edge.scheduler.state import LimitHeadroom, LimitKind


class ServerState(str, Enum):
    SERVING = "serving"
    DRAINING = "draining"
    STOPPED = "stopped"


class ReadyReason(str, Enum):
    """Why /ready answers as it does (the JSON `reason`)."""

    READY = "ready"
    UNLOADED = "unloaded"  # idle keep-alive unloaded the model; the next request reloads it
    DRAINING = "draining"
    STOPPED = "stopped"
    LOADING = "loading"
    FAILED = "failed"
    PAUSED = "paused"  # the engine is paused by the scheduler
    THERMAL = "thermal"
    MEMORY = "memory"
    POWER = "power"
    QUEUE_FULL = "queue_full"
    UNKNOWN = "unknown"  # engine stats unavailable


_LIMIT_REASON = {LimitKind.THERMAL: ReadyReason.THERMAL, LimitKind.MEMORY: ReadyReason.MEMORY,
                 LimitKind.POWER: ReadyReason.POWER}


@dataclass(frozen=True)
class Readiness:
    ready: bool
    reason: ReadyReason
    detail: str


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
    responses: ResponseStore = field(default_factory=ResponseStore)  # for previous_response_id
    model_path: Path | None = None  # the served GGUF file (Ollama's /api/show, /api/tags); None: unknown
    ollama_cache: dict[str, Any] = field(default_factory=dict)  # model facts read once (api/ollama_models)
    host: ModelHost | None = None  # several models from one endpoint; None: `engine` is the one model
    model_caches: dict[str, dict[str, Any]] = field(default_factory=dict)  # ollama_cache per hosted model
    lease: Lease | None = None  # set in a request's view of a hosted model (`for_model`)
    probes: ProbeRecord = field(default_factory=ProbeRecord)  # /health/inference and the prober

    async def for_model(self, request: Any, name: str) -> ApiState:
        """This state as one request sees it: `engine`, `model_*` and `plan` are those of the model
        `name` names, held resident by a lease until the request ends (api/leases.py); the rest is
        shared. Loads the model first if it is not resident (the wait is the request's queue time).
        Without a host: checks the name against the one model (ModelNotFound) and returns self."""
        if self.host is None:
            self.check_model(name)
            return self
        host, leases = self.host, lease_list(request)

        def take() -> Lease:  # the lease is recorded in the thread: a client gone meanwhile leaks none
            lease = host.acquire(name)
            leases.append(lease)
            return lease

        lease = host.acquire_resident(name)  # resident: no thread hop on the request's path
        if lease is not None:
            leases.append(lease)
        else:
            lease = await anyio.to_thread.run_sync(take)
        ref = lease.model.ref
        tally(model=ref.key)  # the audit line names the model this request ran on
        return replace(self, engine=lease.engine, model_id=ref.key, model_names=ref.names,
                       model_path=ref.path, plan=lease.model.plan,
                       ollama_cache=self.model_caches.setdefault(ref.key, {}), lease=lease)

    def view_of(self, ref: ModelRef, engine: EngineLike | None = None) -> ApiState:
        """A hosted model's names, file and facts cache without a lease (listings: /api/tags,
        /v1/models, /api/show); `engine` only where the model is resident."""
        return replace(self, engine=engine if engine is not None else self.engine, model_id=ref.key,
                       model_names=ref.names, model_path=ref.path,
                       ollama_cache=self.model_caches.setdefault(ref.key, {}))

    def resolve_name(self, name: str) -> str:
        """The key of the model `name` names, without loading it (ModelNotFound, a 404, otherwise)."""
        if self.host is None:
            self.check_model(name)
            return self.model_id
        return self.host.names.resolve(name).key

    def set_keep_alive(self, keep_alive_s: float | None) -> None:
        """This request's model stays loaded for `keep_alive_s` once idle (None: forever; 0: unload
        when idle). Hosted: the host's record, applied when the model's last lease ends."""
        if self.host is not None and self.lease is not None:
            self.host.set_keep_alive(self.model_id, keep_alive_s)
        else:
            self.engine.set_keep_alive(keep_alive_s)

    def check_model(self, name: str) -> None:
        """Ollama's tag for an untagged name ("x:latest", what /api/tags lists) is accepted on every
        route, as Ollama's own OpenAI-compatible routes accept it."""
        if name not in self.model_names and name.removesuffix(":latest") not in self.model_names:
            raise ModelNotFound(name, f"this server serves {self.model_id!r}")

    def scheduler_status(self) -> dict[str, Any] | None:
        return None if self.scheduler is None else self.scheduler.status()

    def limits(self) -> tuple[LimitHeadroom, ...]:
        return () if self.scheduler is None else self.scheduler.limits()

    def readiness(self) -> tuple[bool, str]:
        """(ready, why) in words; `readiness_report()` has the typed reason."""
        r = self.readiness_report()
        return r.ready, r.detail

    def readiness_report(self) -> Readiness:
        """Ready means "send me work": lifecycle, engine, each limit, then the queue bound."""
        if self.server_state is not ServerState.SERVING:
            draining = self.server_state is ServerState.DRAINING
            reason = ReadyReason.DRAINING if draining else ReadyReason.STOPPED
            return Readiness(False, reason, f"server {self.server_state.value}")
        state = self.engine.state
        if state is EngineState.LOADING:
            return Readiness(False, ReadyReason.LOADING, "loading model")
        if state not in (EngineState.READY, EngineState.UNLOADED, EngineState.PAUSED):
            return Readiness(False, ReadyReason.FAILED, f"engine {state.value}")
        for lim in self.limits():
            if lim.blocking:
                return Readiness(False, _LIMIT_REASON[lim.kind],
                                 f"past the {lim.kind.value} limit: {lim.reason}")
        paused = "paused by the scheduler (device hot or short of memory)"
        if state is EngineState.PAUSED:
            return Readiness(False, ReadyReason.PAUSED, paused)
        if state is EngineState.READY:
            try:
                if self.engine.stats().knobs.paused:
                    return Readiness(False, ReadyReason.PAUSED, paused)
            except Exception:
                return Readiness(False, ReadyReason.UNKNOWN, "engine stats unavailable")
        load = self.admission.load()
        if load.queue_full:
            return Readiness(False, ReadyReason.QUEUE_FULL,
                             f"queue full: {load.running} running, {load.waiting} waiting "
                             f"of {load.max_queue}")
        if state is EngineState.UNLOADED:
            return Readiness(True, ReadyReason.UNLOADED,
                             "model unloaded after idle keep-alive; reloads on the next request")
        return Readiness(True, ReadyReason.READY, "ready")

    def balancer_weight(self) -> AgentWeight:
        """What the HAProxy agent check answers now (see edge.scheduler.headroom.agent_weight)."""
        r = self.readiness_report()
        return agent_weight(draining=self.server_state is not ServerState.SERVING, ready=r.ready,
                            not_ready_reason=r.detail, limits=self.limits(), load=self.admission.load())

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
