"""The closed-loop load generator: C workers, each sending streaming requests back to back.

A request fails by HTTP status ("http"), timeout, transport error, an error event or a
cut-off inside a 200 stream ("stream"), or a complete 200 answer without a single output
token ("empty": every request asks for max_tokens >= 1, and e.g. llama-cpp-python's server
answers so when a newer request interrupts it); only the rest are timed.

One `httpx.AsyncClient` per run; every request streams (`stream: true` with
`stream_options.include_usage`) so the client sees the first token arrive. A
request's whole life is bounded by `timeout_s` (asyncio.wait_for around it, and
httpx's own connect/read timeouts), so a server that hangs costs one timeout per
worker, never the run. Clock and sleep are parameters for tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from edge.bench.stats import RequestResult
from edge.bench.workload import RequestSpec, Workload

Now = Callable[[], float]


@dataclass
class _Progress:
    """What the SSE parser learned so far (kept across a timeout, for the record)."""

    ttft_s: float | None = None
    deltas: int = 0
    usage_tokens: int | None = None
    done: bool = False  # saw data: [DONE] or a finish_reason
    stream_error: str | None = None
    answered: bool = False  # the response's status line and headers arrived
    retries: int = 0  # sent again after a kept-alive connection dropped unanswered


def _content_of(choice: dict[str, Any]) -> str:
    delta = choice.get("delta")
    if isinstance(delta, dict):
        # reasoning models stream their thinking first; it is output all the same
        return str(delta.get("content") or "") + str(delta.get("reasoning_content") or "")
    return str(choice.get("text") or "")


def _parse_event(data: str, p: _Progress, t_s: float) -> None:
    """One SSE `data:` payload into the running progress."""
    if data == "[DONE]":
        p.done = True
        return
    try:
        chunk = json.loads(data)
    except json.JSONDecodeError:
        p.stream_error = f"unparsable event {data[:80]!r}"
        return
    if not isinstance(chunk, dict):
        return
    if chunk.get("error"):
        err = chunk["error"]
        p.stream_error = str(err.get("message") if isinstance(err, dict) else err)[:200]
        return
    usage = chunk.get("usage")
    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
        p.usage_tokens = usage["completion_tokens"]
    for choice in chunk.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        if _content_of(choice):
            p.deltas += 1
            if p.ttft_s is None:
                p.ttft_s = t_s
        if choice.get("finish_reason"):
            p.done = True


async def _stream(client: httpx.AsyncClient, url: str, body: dict[str, Any], p: _Progress, now: Now,
                  t_start: float) -> int:
    """Send one request and parse its stream into `p`; returns the HTTP status."""
    async with client.stream("POST", url, json=body) as resp:
        p.answered = True
        if resp.status_code != 200:
            text = (await resp.aread())[:300].decode(errors="replace")
            p.stream_error = text
            return resp.status_code
        async for line in resp.aiter_lines():
            if line.startswith("data:"):
                _parse_event(line[5:].strip(), p, now() - t_start)
        return resp.status_code


async def _send(client: httpx.AsyncClient, url: str, body: dict[str, Any], p: _Progress, now: Now,
                t_start: float, timeout_s: float) -> int:
    """`_stream` within what is left of the timeout. A kept-alive connection the server had closed
    answers nothing, so it is sent again once, as the OpenAI SDK's own retry does; the time lost
    stays counted."""
    while True:
        try:
            return await asyncio.wait_for(_stream(client, url, body, p, now, t_start),
                                          timeout_s - (now() - t_start))
        except (httpx.RemoteProtocolError, httpx.ConnectError):
            if p.retries or p.answered:
                raise
            p.retries += 1


def _stream_failure(status: int | None, p: _Progress) -> tuple[str | None, str]:
    """(error kind, detail) of a stream that ended, or (None, "") when it is a timed answer."""
    if status != 200:
        return "http", f"{status} {p.stream_error or ''}".strip()
    if p.stream_error is not None:
        return "stream", p.stream_error
    if not p.done:
        return "stream", "the stream ended without [DONE] or a finish_reason"
    if p.deltas == 0 and not p.usage_tokens:
        return "empty", "200 with no output token (interrupted by another request?)"
    return None, ""


async def send_one(
    client: httpx.AsyncClient,
    base_url: str,
    path: str,
    model_id: str,
    spec: RequestSpec,
    *,
    index: int,
    warmup: bool,
    t0: float,
    timeout_s: float,
    now: Now = time.perf_counter,
) -> RequestResult:
    """One streaming request, timed from just before it is sent; never raises for a failure. A
    connection that drops before any answer is tried once more (`retries`), within the timeout."""
    body = {"model": model_id, **spec.body, "stream": True, "stream_options": {"include_usage": True}}
    p = _Progress()
    status: int | None = None
    t_start = now()
    try:
        status = await _send(client, base_url + path, body, p, now, t_start, timeout_s)
        error, detail = _stream_failure(status, p)
    except (asyncio.TimeoutError, httpx.TimeoutException):
        error, detail = "timeout", f"no complete answer within {timeout_s:g} s"
    except (httpx.HTTPError, OSError) as exc:
        error, detail = "transport", f"{type(exc).__name__}: {exc}"
    t_end = now()
    return RequestResult(
        index=index,
        warmup=warmup,
        start_s=t_start - t0,
        end_s=t_end - t0,
        ttft_s=p.ttft_s,
        n_out=p.usage_tokens if p.usage_tokens is not None else p.deltas,
        tokens_from_usage=p.usage_tokens is not None,
        status=status,
        error=error,
        detail=detail,
        retries=p.retries,
    )


async def run_step(
    client: httpx.AsyncClient,
    base_url: str,
    model_id: str,
    workload: Workload,
    concurrency: int,
    *,
    requests: int | None,
    duration_s: float | None,
    warmup: int,
    timeout_s: float,
    now: Now = time.perf_counter,
    on_result: Callable[[RequestResult], None] | None = None,
) -> list[RequestResult]:
    """`concurrency` workers send requests back to back: `warmup` unmeasured ones first, then
    `requests` measured ones, or until `duration_s` (counted from the step's start) has passed."""
    if requests is None and duration_s is None:
        raise ValueError("a step needs a request count or a duration")
    total = None if requests is None else warmup + requests
    t0 = now()
    next_index = 0
    results: list[RequestResult] = []

    async def worker() -> None:
        nonlocal next_index
        while (total is None or next_index < total) and (duration_s is None or now() - t0 < duration_s):
            i = next_index
            next_index += 1
            r = await send_one(
                client, base_url, workload.path, model_id, workload.request(concurrency, i),
                index=i, warmup=i < warmup, t0=t0, timeout_s=timeout_s, now=now,
            )
            results.append(r)
            if on_result is not None:
                on_result(r)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return sorted(results, key=lambda r: r.index)


def _status_point(t_s: float, st: dict[str, Any]) -> dict[str, Any]:
    """The few /v1/status fields the report plots, flattened."""
    sched = st.get("scheduler") if isinstance(st.get("scheduler"), dict) else {}
    decision = sched.get("decision") if isinstance(sched.get("decision"), dict) else {}
    knobs = st.get("knobs") if isinstance(st.get("knobs"), dict) else {}
    slots = st.get("slots") if isinstance(st.get("slots"), dict) else {}
    power = sched.get("power") if isinstance(sched.get("power"), dict) else {}
    engine = st.get("engine") if isinstance(st.get("engine"), dict) else {}
    return {
        "t_s": round(t_s, 3),
        "temp_c": sched.get("temp_c"),
        "mode": decision.get("mode") if decision else (None if sched else "no-scheduler"),
        "budget": decision.get("budget"),
        "limit_c": decision.get("t_lim_c"),
        "reason": decision.get("reason"),
        "knobs": {k: knobs.get(k) for k in ("active_limit", "n_threads", "duty", "off_threads", "paused")},
        "slots_active": slots.get("active"),
        "waiting": slots.get("waiting"),
        "power_w": power.get("power_w"),
        "power_budget_w": power.get("budget_w"),
        "on_battery": power.get("on_battery"),
        "battery_pct": power.get("battery_pct"),
        "energy_j": power.get("energy_j"),  # cumulative, while power was known ...
        "energy_tokens": power.get("energy_tokens"),  # ... and the tokens generated meanwhile
        "tokens_decoded": engine.get("total_tokens_decoded"),
    }


async def sample_status(
    client: httpx.AsyncClient,
    base_url: str,
    out: list[dict[str, Any]],
    stop: asyncio.Event,
    *,
    t0: float,
    interval_s: float = 1.0,
    now: Now = time.perf_counter,
) -> None:
    """Append one point of edge's /v1/status per `interval_s` to `out` until `stop` is set.

    A failed poll is recorded as a point with an "error" (the timeline shows the gap)."""
    while not stop.is_set():
        t = now() - t0
        try:
            resp = await client.get(base_url + "/v1/status", timeout=max(interval_s, 1.0))
            resp.raise_for_status()
            out.append(_status_point(t, resp.json()))
        except (httpx.HTTPError, ValueError) as exc:
            out.append({"t_s": round(t, 3), "error": f"{type(exc).__name__}: {exc}"[:200]})
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), interval_s)
