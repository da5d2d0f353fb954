"""/health/inference, the periodic prober and the watchdog that trusts it (fake engines, no real time)."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi.testclient import TestClient

from edge.api.app import create_app
from edge.api.health_probe import probe
from edge.config import Settings
from edge.service.notify import watchdog_loop
from edge.service.prober import probe_idle, probe_loop
from tests.fakes import ScriptedEngine, make_app
from tests.unit.test_model_host import Box


def test_a_probe_generates_one_real_token_and_reports_its_milliseconds() -> None:
    app, engine = make_app()
    r = TestClient(app).get("/health/inference")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "ok" and body["model"] == engine.model_name and body["latency_ms"] >= 0
    (req,) = engine.submitted
    assert req.max_tokens == 1 and req.sampling.temperature == 0.0 and req.request_id == "health-probe"
    text = TestClient(app).get("/metrics").text
    assert "edge_inference_probe_ok 1.0" in text and "edge_inference_probe_latency_seconds" in text


def test_an_engine_that_produces_no_token_in_time_fails_the_probe_with_503() -> None:
    app, engine = make_app(ScriptedEngine(autostep=False))  # steps only when told: hung
    st = app.state.edge
    asked: list[float] = []

    async def no_token(awaitable: Any, timeout_s: float) -> Any:
        asked.append(timeout_s)
        awaitable.close()
        raise asyncio.TimeoutError

    from types import SimpleNamespace

    result = asyncio.run(probe(st, SimpleNamespace(scope={"state": {}}), None, 10.0, wait_for=no_token))
    assert not result.ok and asked == [10.0] and "no token within 10 s" in result.detail
    assert [h.cancel_requested for h in engine.waiting + engine.active] == [True]  # the probe was cancelled


def test_a_failing_engine_fails_the_probe_and_the_watchdog_withholds_its_heartbeat() -> None:
    app, _ = make_app(ScriptedEngine(fail_with=RuntimeError("ggml: abort")))
    r = TestClient(app).get("/health/inference")
    assert r.status_code == 503 and "ggml: abort" in r.json()["detail"] and r.headers["retry-after"]
    st = app.state.edge
    assert not st.probes.passing

    class Notifier:
        watchdog_s = 1.0
        beats = 0

        def watchdog(self) -> None:
            self.beats += 1

        def status(self, text: str) -> None:
            self.text = text

    async def no_sleep(_s: float) -> None:
        return None

    n = Notifier()
    beats = asyncio.run(watchdog_loop(n, st.engine, lambda: 0.0, 60.0, sleep=no_sleep, max_beats=3,
                                      probes_pass=lambda: st.probes.passing))
    assert beats == 0 and "inference probe failed" in n.text


def test_a_host_with_nothing_resident_is_healthy_and_probes_do_not_keep_idle_models_resident() -> None:
    box = Box()
    app = create_app(Settings(), box.host, None, api_key="", host=box.host)  # type: ignore[arg-type]
    c = TestClient(app)
    r = c.get("/health/inference")
    assert r.status_code == 200 and r.json()["model"] is None
    box.use("smol")
    engine = box.engines["smol"]
    result = asyncio.run(probe_idle(app.state.edge))
    assert result is not None and result.ok and result.model == "smol"
    assert engine.submitted[-1].request_id == "health-probe"
    assert engine.keep_alive_s is not None and engine.keep_alive_s <= 300.0  # the idle timer as before
    assert engine.keep_alive_calls[-1] == engine.keep_alive_s
    r = c.get("/health/inference", params={"model": "gemma"})  # a model named is loaded and probed
    assert r.status_code == 200 and r.json()["model"] == "gemma"


def test_the_prober_runs_only_while_idle() -> None:
    app, _engine = make_app()
    st = app.state.edge

    async def no_sleep(_s: float) -> None:
        return None

    assert asyncio.run(probe_loop(st, 60.0, sleep=no_sleep, max_rounds=2)) == 2
    st.in_flight["busy"] = object()
    assert asyncio.run(probe_loop(st, 60.0, sleep=no_sleep, max_rounds=2)) == 0
    assert st.probes.runs == 2
