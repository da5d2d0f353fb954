"""Operations endpoints: /health (liveness), /ready, /metrics, /v1/status."""

from __future__ import annotations

import dataclasses
import time
from enum import Enum
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from edge import __version__
from edge.api.build import running
from edge.api.health_probe import probe
from edge.api.reasoning import status as reasoning_status
from edge.api.routes import query_doc
from edge.api.state import ApiState

router = APIRouter()


def _state(request: Request) -> ApiState:
    st: ApiState = request.app.state.edge
    return st


def _plain(obj: Any) -> Any:
    """JSON-safe view of dataclasses, enums, paths and nested containers."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Enum):
        return obj.value
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [_plain(v) for v in obj]
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    return str(obj)


@router.get("/health", response_model=None)
async def health() -> dict[str, str]:
    """Liveness: the process answers. Readiness is /ready."""
    return {"status": "ok"}


@router.get("/health/inference", openapi_extra=query_doc("model", "the model to probe (default: the first)"))
async def health_inference(request: Request) -> Response:
    """A real one-token generation (api/health_probe.py): 200 with its milliseconds, or 503."""
    st = _state(request)
    model = request.query_params.get("model")
    result = st.probes.add(await probe(st, request, model, st.settings.probe_timeout_s))
    return JSONResponse(result.to_json(), status_code=200 if result.ok else 503,
                        headers={} if result.ok else {"Retry-After": "1"})


@router.get("/ready")
async def ready(request: Request) -> Response:
    """Readiness: 200 while this box takes work, 503 + Retry-After with a `reason` code otherwise."""
    st = _state(request)
    r = st.readiness_report()
    body = {"status": "ready" if r.ready else "unavailable", "reason": r.reason.value, "detail": r.detail,
            "engine": st.engine.state.value}
    headers = {} if r.ready else {"Retry-After": "1"}
    return JSONResponse(body, status_code=200 if r.ready else 503, headers=headers)


def balancer_status(st: ApiState) -> dict[str, Any]:
    """The HAProxy agent check's answer now, with why (also shown by `edge status`)."""
    w = st.balancer_weight()
    s = st.settings
    return {
        "agent": None if s.agent_port is None else {"host": s.agent_host or "127.0.0.1",
                                                    "port": s.agent_port},
        "state": w.state.value,
        "weight_pct": w.weight_pct,
        "reason": w.reason,
        "line": w.line(),
        "factors": dict(w.factors),
    }


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    return Response(_state(request).metrics.render(), media_type=CONTENT_TYPE_LATEST)


@router.get("/v1/status", response_model=None)
async def status(request: Request) -> dict[str, Any]:
    st = _state(request)
    r = st.readiness_report()
    ok, reason = r.ready, r.detail
    stats = None
    try:
        stats = st.engine.stats()
    except Exception:  # engine still loading
        stats = None
    plan = st.plan
    if plan is None and st.host is not None:  # the plan of the model served first, as one-model serve showed
        plan = next((h.plan for h in st.host.models() if h.ref.key == st.model_id), None)
    plan_json = _plain(plan) if plan is not None else None
    return {
        "version": __version__,
        "build": running(),  # llama-cpp-python, llama.cpp commit and build, backends
        "model": {
            "id": st.model_id,
            "aliases": sorted(st.model_names),
            "n_ctx": st.engine.n_ctx,
            "name": st.engine.model_name,
        },
        "server": {
            "state": st.server_state.value,
            "ready": ok,
            "reason": reason,
            "ready_reason": r.reason.value,
            "uptime_s": round(time.time() - st.started_unix_s, 3),
            "in_flight": len(st.in_flight),
            "max_queue": st.settings.max_queue,
            "auth": st.api_key is not None,
        },
        "engine": _plain(stats) if stats is not None else {"state": st.engine.state.value},
        "slots": {
            "total": st.engine.n_slots,
            "active": stats.active if stats else 0,
            "parked": stats.parked if stats else 0,
            "waiting": stats.waiting if stats else 0,
        },
        "knobs": _plain(stats.knobs) if stats else None,
        "queue": _plain(st.admission.status()),
        "plan": plan_json,
        "scheduler": _plain(st.scheduler_status()),
        "host": None if st.host is None else {
            "memory_budget_bytes": st.host.budget_bytes, "resident_bytes": st.host.held_bytes(),
            "models": st.host.status()},
        "balancer": balancer_status(st),
        "reasoning": reasoning_status(st),  # the thinking budget in force, and why
    }
