"""/ready means "send me work": each reason it refuses for, and what /v1/status tells the balancer."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from edge.runtime.types import Priority
from edge.scheduler.admission import Admission
from edge.scheduler.state import LimitHeadroom, LimitKind
from tests.fakes import ScriptedEngine, make_app


class LimitScheduler:
    """A scheduler whose limits the test sets (the real one derives them from its decision)."""

    def __init__(self, admission: Admission) -> None:
        self.admission = admission
        self.current: tuple[LimitHeadroom, ...] = ()

    def limits(self) -> tuple[LimitHeadroom, ...]:
        return self.current

    def status(self) -> dict[str, Any]:
        return {}

    def reasoning_budget(self, base_tokens: int | None) -> Any:
        from edge.scheduler.reasoning import thinking_budget

        return thinking_budget(base_tokens, None)

    def start_thread(self, stop_event: Any) -> Any:
        raise AssertionError("not started in unit tests")


def _app(n_slots: int = 2, max_queue: int = 1) -> tuple[TestClient, LimitScheduler, Admission]:
    adm = Admission(max_queue, n_slots=n_slots, scheduled=True)
    sched = LimitScheduler(adm)
    app, _ = make_app(ScriptedEngine(n_slots=n_slots, autostep=False), scheduler=sched, max_queue=max_queue)
    return TestClient(app), sched, adm


def test_each_blocking_limit_is_its_own_503_reason() -> None:
    client, sched, _ = _app()
    assert client.get("/ready").json()["reason"] == "ready"
    for kind, reason in ((LimitKind.THERMAL, "guard: 96.4 C"), (LimitKind.MEMORY, "memory tight: PSI"),
                         (LimitKind.POWER, "14.9 W over the 12 W budget")):
        sched.current = (LimitHeadroom(kind, 0.0, True, reason),)
        r = client.get("/ready")
        assert r.status_code == 503 and r.headers["Retry-After"] == "1"
        assert r.json()["reason"] == kind.value and reason in r.json()["detail"]
        b = client.get("/v1/status").json()["balancer"]
        assert b["state"] == "down" and b["line"].startswith(f"down #past the {kind.value} limit")
    # near a limit but not past it: still ready, with less weight
    sched.current = (LimitHeadroom(LimitKind.POWER, 0.4, False, "11 W of 12 W"),)
    assert client.get("/ready").status_code == 200
    s = client.get("/v1/status").json()
    assert s["server"]["ready_reason"] == "ready"
    assert s["balancer"]["weight_pct"] == 40 and s["balancer"]["reason"] == "power 0.40: 11 W of 12 W"
    assert s["balancer"]["factors"] == {"power": 0.4, "slots": 1.0, "queue": 1.0}
    assert s["balancer"]["agent"] is None  # --agent-port not set


def test_full_queue_is_not_ready_until_a_request_finishes() -> None:
    client, _, adm = _app(n_slots=1, max_queue=1)
    running = adm.admit(Priority.INTERACTIVE, 4, 4)
    running.start()
    assert client.get("/ready").status_code == 200  # one may still wait
    b = client.get("/v1/status").json()["balancer"]
    assert b["weight_pct"] == 75 and b["reason"].startswith("slots 0.75")
    waiting = adm.admit(Priority.INTERACTIVE, 4, 4)
    r = client.get("/ready")
    assert r.status_code == 503 and r.json()["reason"] == "queue_full"
    assert r.json()["detail"] == "queue full: 1 running, 1 waiting of 1"
    assert client.get("/v1/status").json()["balancer"]["state"] == "down"
    running.release()
    waiting.start()
    assert client.get("/ready").status_code == 200


def test_draining_beats_every_other_reason_and_health_stays_200() -> None:
    client, sched, _ = _app()
    sched.current = (LimitHeadroom(LimitKind.THERMAL, 0.0, True, "guard"),)
    client.app.state.edge.begin_drain()  # type: ignore[attr-defined]
    r = client.get("/ready")
    assert r.status_code == 503 and r.json()["reason"] == "draining"
    assert client.get("/v1/status").json()["balancer"]["line"] == "drain"
    assert client.get("/health").status_code == 200


def test_request_id_is_echoed_on_every_response_when_sane() -> None:
    app, _ = make_app(api_key="k")
    client = TestClient(app)
    assert client.get("/ready", headers={"X-Request-ID": "abc-123"}).headers["x-request-id"] == "abc-123"
    refused = client.get("/v1/models", headers={"X-Request-ID": "7F00:1F90_1"})
    assert refused.status_code == 401 and refused.headers["x-request-id"] == "7F00:1F90_1"
    assert "x-request-id" not in client.get("/ready").headers
    for bad in ("x" * 129, "has space"):
        assert "x-request-id" not in client.get("/ready", headers={"X-Request-ID": bad}).headers
