"""Health, readiness, metrics and status endpoints."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from edge.api.state import ServerState
from edge.runtime.types import EngineState, Knobs
from edge.scheduler.admission import Admission
from tests.fakes import CHAT, ScriptedEngine, make_app


def _metrics(client: TestClient) -> dict[str, float]:
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(client.get("/metrics").text):
        for s in fam.samples:
            key = s.name + (
                "{" + ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())) + "}" if s.labels else ""
            )
            out[key] = s.value
    return out


def test_health_is_always_200_and_ready_follows_state() -> None:
    engine = ScriptedEngine()  # LOADING
    app, _ = make_app(engine)
    engine.set_state(EngineState.LOADING)
    client = TestClient(app)
    assert client.get("/health").json() == {"status": "ok"}
    r = client.get("/ready")
    assert r.status_code == 503 and r.json()["reason"] == "loading" and r.headers["Retry-After"]
    assert r.json()["detail"] == "loading model"
    engine.set_state(EngineState.READY)
    assert client.get("/ready").status_code == 200
    engine.apply(Knobs(active_limit=0, n_threads=1, paused=True))
    r = client.get("/ready")
    assert r.status_code == 503 and r.json()["reason"] == "paused" and "paused" in r.json()["detail"]
    engine.apply(Knobs(active_limit=2, n_threads=1))
    engine.set_state(EngineState.PAUSED)
    assert client.get("/ready").status_code == 503
    engine.set_state(EngineState.UNLOADED)  # keep-alive unload: requests are accepted and reload it
    r = client.get("/ready")
    assert r.status_code == 200 and r.json()["reason"] == "unloaded"
    engine.set_state(EngineState.READY)
    app.state.edge.begin_drain()
    r = client.get("/ready")
    assert r.status_code == 503 and r.json()["reason"] == "draining"
    assert r.json()["detail"] == "server draining"
    assert client.get("/health").status_code == 200


def test_draining_server_refuses_new_work_with_503() -> None:
    app, engine = make_app()
    client = TestClient(app)
    app.state.edge.server_state = ServerState.DRAINING
    r = client.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 503 and r.headers["Retry-After"] == "1"
    assert engine.submitted == []


def test_metrics_count_requests_tokens_and_engine_gauges() -> None:
    app, engine = make_app(ScriptedEngine(n_slots=3))
    client = TestClient(app)
    client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 5})
    client.post("/v1/chat/completions", json={**CHAT, "model": "nope"})
    m = _metrics(client)
    assert m["edge_requests_total{endpoint=/v1/chat/completions,status=200}"] == 1
    assert m["edge_requests_total{endpoint=/v1/chat/completions,status=404}"] == 1
    assert m["edge_generated_tokens_total"] == 5
    assert m["edge_prompt_tokens_total"] == 4
    assert m["edge_ttft_seconds_count"] == 1
    assert m["edge_token_latency_seconds_count"] == 4  # tokens after the first
    assert m["edge_slots"] == 3
    assert m["edge_queue_depth"] == 0 and m["edge_active_slots"] == 0
    assert m["edge_engine_tokens_decoded_total"] == engine.total_tokens == 5
    assert m["edge_kv_cells_total"] == 64 * 3
    assert m["edge_engine_state{state=ready}"] == 1 and m["edge_engine_state{state=loading}"] == 0


def test_metrics_registries_are_per_app() -> None:
    a, _ = make_app()
    b, _ = make_app()
    TestClient(a).post("/v1/chat/completions", json=CHAT)
    assert _metrics(TestClient(b)).get("edge_generated_tokens_total") == 0


class FakeScheduler:
    def __init__(self) -> None:
        self.admission = Admission(5, n_slots=2, scheduled=True)

    def start_thread(self, stop_event: Any) -> Any:
        raise AssertionError("the app never starts the scheduler")

    def limits(self) -> tuple:
        return ()

    def reasoning_budget(self, base_tokens: int | None) -> Any:
        from edge.scheduler.reasoning import thinking_budget

        return thinking_budget(base_tokens, None)

    def status(self) -> dict[str, Any]:
        return {
            "decision": {"mode": "limiting", "reason": "hot", "active_limit": 1, "paused": False},
            "temp_c": 81.5,
            "telemetry_stale": False,
            "ticks": 12,
        }


def test_scheduler_status_appears_in_metrics_and_status() -> None:
    app, _ = make_app(scheduler=FakeScheduler())
    client = TestClient(app)
    m = _metrics(client)
    assert m["edge_scheduler_temp_c"] == 81.5
    assert m["edge_scheduler_decision_active_limit"] == 1
    assert m["edge_scheduler_telemetry_stale"] == 0
    s = client.get("/v1/status").json()
    assert s["scheduler"]["decision"]["mode"] == "limiting"


def test_status_reports_model_slots_queue_knobs() -> None:
    app, _engine = make_app(ScriptedEngine(n_slots=2, autostep=False), max_queue=5)
    client = TestClient(app)
    s = client.get("/v1/status").json()
    assert s["model"]["id"] == "scripted-model" and s["model"]["n_ctx"] == 64
    assert s["slots"] == {"total": 2, "active": 0, "parked": 0, "waiting": 0}
    assert s["knobs"]["active_limit"] == 2
    assert s["queue"]["max_queue"] == 5
    assert s["server"]["ready"] is True and s["server"]["auth"] is False
    assert s["engine"]["state"] == "ready"
