"""`GET /health/inference`: is the model really answering? One real token, measured.

`/health` says the process answers and `/ready` reads state; an engine that is idle but hung,
or steps without producing tokens, passes both. This probe generates one greedy token on a
resident model (`?model=` picks one, loading it if needed; else the most recently used
resident model), as an interactive request straight to the engine (no admission: a full
queue must not make a healthy box look dead), and answers 200 with the milliseconds it took,
or 503 when no token came within `probe_timeout_s`. A host with no model resident has nothing
to probe and is healthy (models load on demand). The last result is kept for `/metrics`, the
periodic prober and the systemd watchdog (`edge.service.server`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from edge.api.probe_record import ProbeRecord, ProbeResult
from edge.api.state import ApiState
from edge.host.residency import ModelState
from edge.runtime.types import GenerationRequest, SamplingParams

PROBE_PROMPT = "Hi"
GREEDY = SamplingParams(temperature=0.0, top_k=1, top_p=1.0, min_p=0.0, seed=0)


def pick_model(st: ApiState) -> str | None:
    """The most recently used resident model (None: nothing resident)."""
    if st.host is None:
        return st.model_id
    ready = [h for h in st.host.resident() if h.state is ModelState.READY]
    return max(ready, key=lambda h: h.last_used_s).ref.key if ready else None


async def probe(st: ApiState, request: Any, model: str | None, timeout_s: float,
                wait_for: Callable[..., Awaitable[Any]] = asyncio.wait_for) -> ProbeResult:
    """One token on `model` (or the most recently used resident model), within `timeout_s`
    (`wait_for`: asyncio's, or a fake clock's in tests)."""
    name = model or pick_model(st)
    if name is None:
        return ProbeResult(True, None, None, "no model resident: nothing to probe", time.time())
    view = await st.for_model(request, name)
    t0 = time.perf_counter()
    handle = None
    try:
        tokens = view.engine.tokenize(PROBE_PROMPT, True)
        handle = view.engine.submit(GenerationRequest(tokens, max_tokens=1, sampling=GREEDY,
                                                      request_id="health-probe"))
        ev = await wait_for(handle.__aiter__().__anext__(), timeout_s)
    except (asyncio.TimeoutError, TimeoutError):
        if handle is not None:
            handle.cancel()
        return ProbeResult(False, view.model_id, None, f"no token within {timeout_s:g} s", time.time())
    except Exception as exc:  # a failing engine is what this endpoint exists to report
        return ProbeResult(False, view.model_id, None, f"generation failed: {exc}", time.time())
    ms = (time.perf_counter() - t0) * 1000.0
    if ev.error is not None:
        return ProbeResult(False, view.model_id, ms, f"generation failed: {ev.error}", time.time())
    return ProbeResult(True, view.model_id, ms, "one token generated", time.time())


class ProbeCollector(Collector):
    """edge_inference_probe_*: the last probe's latency and result, and the counts."""

    def __init__(self, record: ProbeRecord) -> None:
        self.record = record

    def collect(self) -> Any:
        r = self.record
        yield CounterMetricFamily("edge_inference_probes", "Inference probes run", value=r.runs)
        yield CounterMetricFamily("edge_inference_probe_failures", "Inference probes that failed",
                                  value=r.failures)
        if r.last is not None:
            yield GaugeMetricFamily("edge_inference_probe_ok", "1 if the last inference probe passed",
                                    value=1.0 if r.last.ok else 0.0)
            if r.last.latency_ms is not None:
                yield GaugeMetricFamily("edge_inference_probe_latency_seconds",
                                        "Time to the one token of the last inference probe",
                                        value=r.last.latency_ms / 1000.0)
