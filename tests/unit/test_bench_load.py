"""The load generator against an in-process mock transport and a fake clock (no real time)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from edge.bench.load import _status_point, run_step, send_one
from edge.bench.workload import Workload, parse_dist


class FakeTime:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _chunk(content: str | None = None, finish: str | None = None, usage: int | None = None) -> bytes:
    obj: dict[str, Any] = {"object": "chat.completion.chunk", "choices": []}
    if content is not None or finish is not None:
        obj["choices"] = [{"index": 0, "delta": {"content": content or ""}, "finish_reason": finish}]
    if usage is not None:
        obj["usage"] = {"prompt_tokens": 3, "completion_tokens": usage, "total_tokens": usage + 3}
    return f"data: {json.dumps(obj)}\n\n".encode()


def streaming(clock: FakeTime, ttft_s: float, gap_s: float, n: int, *, usage: bool = True, done: bool = True,
              error_after: int | None = None) -> Callable[[httpx.Request], httpx.Response]:
    """A handler whose stream advances the fake clock: first token after ttft_s, then one per gap_s."""

    def handler(request: httpx.Request) -> httpx.Response:
        async def body() -> AsyncIterator[bytes]:
            yield b": keep-alive comment\n\n"
            yield _chunk(content="")  # the role chunk: no content, not a token
            for k in range(n):
                clock.t += ttft_s if k == 0 else gap_s
                if error_after is not None and k == error_after:
                    yield b'data: {"error": {"message": "engine stopped"}}\n\n'
                    return
                yield _chunk(content=f"t{k} ")
            yield _chunk(finish="length")
            if usage:
                yield _chunk(usage=n)
            if done:
                yield b"data: [DONE]\n\n"

        return httpx.Response(200, content=body(), headers={"content-type": "text/event-stream"})

    return handler


def _workload(endpoint: str = "chat") -> Workload:
    return Workload(parse_dist("fixed:12", "p"), parse_dist("fixed:5", "m"), seed=3,
                    endpoint=endpoint)  # type: ignore[arg-type]


def _one(handler: Callable[[httpx.Request], httpx.Response], clock: FakeTime, **kw: Any) -> Any:
    async def go() -> Any:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            wl = _workload()
            return await send_one(client, "http://t", wl.path, "m1", wl.request(1, 0), index=0, warmup=False,
                                  t0=clock.t, timeout_s=30.0, now=clock, **kw)

    return asyncio.run(go())


def test_timings_and_tokens_from_the_usage_chunk() -> None:
    clock = FakeTime()
    r = _one(streaming(clock, ttft_s=0.25, gap_s=0.02, n=6), clock)
    assert r.ok and r.status == 200 and r.error is None
    assert r.ttft_s == pytest.approx(0.25)
    assert r.e2e_s == pytest.approx(0.25 + 5 * 0.02)
    assert r.tpot_s == pytest.approx(0.02)
    assert (r.n_out, r.tokens_from_usage) == (6, True)


def test_tokens_counted_from_deltas_without_usage() -> None:
    clock = FakeTime()
    r = _one(streaming(clock, 0.1, 0.01, 4, usage=False), clock)
    assert r.ok and (r.n_out, r.tokens_from_usage) == (4, False)


def test_request_body_asks_for_usage_and_streams() -> None:
    seen: list[dict[str, Any]] = []
    clock = FakeTime()
    inner = streaming(clock, 0.1, 0.01, 2)

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append({"path": request.url.path, **json.loads(request.content)})
        return inner(request)

    _one(handler, clock)
    body = seen[0]
    assert body["path"] == "/v1/chat/completions"
    assert body["model"] == "m1" and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 5 and body["temperature"] == 0
    assert body["messages"][0]["role"] == "user" and len(body["messages"][0]["content"].split()) == 12


@pytest.mark.parametrize(
    ("handler", "error", "status"),
    [
        (lambda r: httpx.Response(503, json={"error": {"message": "busy"}}), "http", 503),
        (lambda r: httpx.Response(500, text="boom"), "http", 500),
    ],
)
def test_http_errors_are_counted_by_status(handler: Any, error: str, status: int) -> None:
    r = _one(handler, FakeTime())
    assert (r.ok, r.error, r.status) == (False, error, status)
    assert str(status) in r.detail


def test_transport_errors_and_timeouts() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused")

    def stall(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("read timed out")

    assert _one(refuse, FakeTime()).error == "transport"
    r = _one(stall, FakeTime())
    assert (r.error, r.status) == ("timeout", None)


def test_a_connection_dropped_before_any_answer_is_sent_once_more() -> None:
    clock, calls = FakeTime(), []
    ok = streaming(clock, 0.1, 0.01, 3)

    def drop_first(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        if len(calls) == 1:
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.")
        return ok(request)

    r = _one(drop_first, clock)
    assert (r.ok, r.retries, r.n_out, len(calls)) == (True, 1, 3, 2)


def test_a_connection_that_keeps_dropping_fails_after_one_retry() -> None:
    calls: list[httpx.Request] = []

    def drop(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        raise httpx.RemoteProtocolError("Server disconnected without sending a response.")

    r = _one(drop, FakeTime())
    assert (r.error, r.retries, len(calls)) == ("transport", 1, 2)


def test_an_answer_cut_off_is_not_sent_again() -> None:
    clock, calls = FakeTime(), []

    def cut(request: httpx.Request) -> httpx.Response:
        calls.append(request)

        async def body() -> AsyncIterator[bytes]:
            yield _chunk(content="t0 ")
            raise httpx.RemoteProtocolError("peer closed connection")

        return httpx.Response(200, content=body(), headers={"content-type": "text/event-stream"})

    r = _one(cut, clock)
    assert (r.error, r.retries, len(calls)) == ("transport", 0, 1)


def test_stream_errors() -> None:
    clock = FakeTime()
    r = _one(streaming(clock, 0.1, 0.01, 5, error_after=2), clock)
    assert r.error == "stream" and "engine stopped" in r.detail
    clock = FakeTime()
    r = _one(streaming(clock, 0.1, 0.01, 3, usage=False, done=False), clock)
    assert r.ok  # a finish_reason without [DONE] is a complete answer

    def cut(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=_chunk(content="half"))

    r = _one(cut, FakeTime())
    assert r.error == "stream" and "without [DONE]" in r.detail


def test_a_complete_answer_without_tokens_is_empty() -> None:
    clock = FakeTime()
    r = _one(streaming(clock, 0.1, 0.01, 0, usage=False), clock)
    assert (r.ok, r.error, r.status, r.n_out) == (False, "empty", 200, 0)


def test_run_step_marks_warmup_and_stops_at_the_count() -> None:
    clock = FakeTime()
    handler = streaming(clock, 0.1, 0.01, 3)

    async def go() -> Any:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            return await run_step(client, "http://t", "m1", _workload(), 2, requests=5, duration_s=None,
                                  warmup=2, timeout_s=10.0, now=clock)

    results = asyncio.run(go())
    assert [r.index for r in results] == list(range(7))
    assert [r.warmup for r in results] == [True, True, False, False, False, False, False]
    assert all(r.ok for r in results)


def test_run_step_stops_starting_requests_after_the_duration() -> None:
    clock = FakeTime()
    handler = streaming(clock, 0.2, 0.05, 3)  # each request takes 0.3 s of fake time

    async def go() -> Any:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            return await run_step(client, "http://t", "m1", _workload(), 1, requests=None, duration_s=1.0,
                                  warmup=0, timeout_s=10.0, now=clock)

    results = asyncio.run(go())
    assert [round(r.start_s, 3) for r in results] == [0.0, 0.3, 0.6, 0.9]  # the next would start at 1.2


def test_run_step_needs_a_limit() -> None:
    with pytest.raises(ValueError):
        asyncio.run(run_step(None, "", "", _workload(), 1, requests=None, duration_s=None, warmup=0,  # type: ignore[arg-type]
                             timeout_s=1.0))


def test_completions_endpoint_reads_text_chunks() -> None:
    clock = FakeTime()

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/completions" and "prompt" in json.loads(request.content)

        async def body() -> AsyncIterator[bytes]:
            for k in range(3):
                clock.t += 0.1
                yield f'data: {{"choices": [{{"text": "w{k}", "finish_reason": null}}]}}\n\n'.encode()
            yield b"data: [DONE]\n\n"

        return httpx.Response(200, content=body())

    async def go() -> Any:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            wl = _workload("completions")
            return await send_one(client, "http://t", wl.path, "m", wl.request(1, 0), index=0, warmup=False,
                                  t0=clock.t, timeout_s=5.0, now=clock)

    r = asyncio.run(go())
    assert r.ok and r.n_out == 3 and r.ttft_s == pytest.approx(0.1) and r.e2e_s == pytest.approx(0.3)


def test_status_point_flattens_edge_status() -> None:
    st = {
        "scheduler": {"temp_c": 61.5, "decision": {"mode": "throttled", "budget": 0.42, "reason": "hot",
                                                   "t_lim_c": 95.0}},
        "knobs": {"active_limit": 2, "n_threads": 1, "duty": 0.5, "off_threads": 0, "paused": False},
        "slots": {"active": 2, "waiting": 3},
    }
    p = _status_point(3.21, st)
    assert p == {"t_s": 3.21, "temp_c": 61.5, "mode": "throttled", "budget": 0.42, "reason": "hot",
                 "limit_c": 95.0,
                 "knobs": {"active_limit": 2, "n_threads": 1, "duty": 0.5, "off_threads": 0, "paused": False},
                 "slots_active": 2, "waiting": 3, "power_w": None, "power_budget_w": None,
                 "on_battery": None, "battery_pct": None, "energy_j": None, "energy_tokens": None,
                 "tokens_decoded": None}
    st["scheduler"]["power"] = {"power_w": 6.9, "budget_w": 7.0, "on_battery": False, "battery_pct": None,
                                "energy_j": 120.0, "energy_tokens": 300}
    st["engine"] = {"total_tokens_decoded": 310}
    p = _status_point(4.0, st)
    assert (p["power_w"], p["power_budget_w"], p["energy_j"], p["energy_tokens"], p["tokens_decoded"]) == (
        6.9, 7.0, 120.0, 300, 310)
    assert _status_point(0.0, {"scheduler": None, "knobs": None})["mode"] == "no-scheduler"
