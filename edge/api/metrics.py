"""Prometheus metrics, one CollectorRegistry per app (no process globals).

Request-path metrics (counters, TTFT and per-token histograms) are updated by
the routes. Engine and scheduler gauges are read at scrape time by a custom
collector, so they are always current and cost nothing between scrapes.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from edge.api.audit import tally
from edge.runtime.types import EngineLike, EngineState, EngineStats

log = logging.getLogger(__name__)

TTFT_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
TOKEN_BUCKETS_S = (0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0)
_NAME_RE = re.compile(r"[^a-zA-Z0-9_]")


def _flatten(prefix: str, value: Any, out: dict[str, float]) -> None:
    """Numeric and boolean leaves of a nested dict, as metric-name-safe keys."""
    if isinstance(value, bool):
        out[prefix] = 1.0 if value else 0.0
    elif isinstance(value, (int, float)):
        out[prefix] = float(value)
    elif isinstance(value, dict):
        for k, v in value.items():
            _flatten(f"{prefix}_{_NAME_RE.sub('_', str(k))}" if prefix else _NAME_RE.sub("_", str(k)), v, out)


class _LiveCollector(Collector):
    def __init__(
        self,
        engine: EngineLike,
        in_flight: Callable[[], int],
        scheduler_status: Callable[[], dict[str, Any] | None],
    ) -> None:
        self.engine = engine
        self.in_flight = in_flight
        self.scheduler_status = scheduler_status

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        yield GaugeMetricFamily(
            "edge_http_in_flight", "HTTP generation requests in flight", value=self.in_flight()
        )
        try:
            s = self.engine.stats()
        except Exception:  # the engine may not be loaded yet
            log.debug("engine stats unavailable", exc_info=True)
            return
        state = GaugeMetricFamily(
            "edge_engine_state", "Engine state (1 for the current one)", labels=["state"]
        )
        for st in EngineState:
            state.add_metric([st.value], 1.0 if s.state == st else 0.0)
        yield state
        for name, (doc, value) in _engine_gauges(s).items():
            yield GaugeMetricFamily(name, doc, value=float(value))
        for name, (doc, value) in _engine_counters(s).items():
            yield CounterMetricFamily(name, doc, value=float(value))
        yield from self._scheduler_gauges()

    def _scheduler_gauges(self) -> Iterator[GaugeMetricFamily]:
        """Every numeric field of the scheduler's status, flattened (none without a scheduler)."""
        try:
            status = self.scheduler_status()
        except Exception:
            log.warning("scheduler status failed", exc_info=True)
            status = None
        if status:
            flat: dict[str, float] = {}
            _flatten("", status, flat)
            for key, value in sorted(flat.items()):
                yield GaugeMetricFamily(f"edge_scheduler_{key}", f"Scheduler status field {key}", value=value)


def _engine_gauges(s: EngineStats) -> dict[str, tuple[str, float]]:
    """The engine's current state as gauges: name -> (help, value)."""
    return {
        "edge_queue_depth": ("Requests waiting for a slot", s.waiting),
        "edge_queue_depth_interactive": (
            "Interactive requests waiting for a slot",
            s.waiting_interactive,
        ),
        "edge_active_slots": ("Sequences decoding", s.active),
        "edge_parked_slots": ("Sequences held back by the active limit", s.parked),
        "edge_slots": ("Configured slots", s.n_slots),
        "edge_kv_cells_used": ("KV cache cells in use", s.kv_cells_used),
        "edge_kv_cells_total": ("KV cache cells", s.kv_cells_total),
        "edge_kv_usage_ratio": (
            "KV cache use, 0-1",
            s.kv_cells_used / s.kv_cells_total if s.kv_cells_total else 0.0,
        ),
        "edge_engine_step_seconds": ("Wall time of the last engine step", s.step_time_s),
        "edge_engine_decode_seconds": ("Time in llama_decode in the last step", s.decode_time_s),
        "edge_knob_active_limit": ("Scheduler knob: active sequence limit", s.knobs.active_limit),
        "edge_knob_threads": ("Scheduler knob: decode threads", s.knobs.n_threads),
        "edge_knob_duty": ("Scheduler knob: duty cycle", s.knobs.duty),
        "edge_knob_off_threads": ("Scheduler knob: threads for the rest of the duty cycle (0: idle)",
                                  s.knobs.off_threads),
        "edge_knob_paused": ("Scheduler knob: paused", float(s.knobs.paused)),
        "edge_knob_admit_background": (
            "Scheduler knob: background admitted",
            float(s.knobs.admit_background),
        ),
        "edge_knob_speculate": ("Scheduler knob: speculative decoding allowed", float(s.knobs.speculate)),
        "edge_spec_draft_len": ("Draft tokens per decoding sequence in the last step", s.spec_draft_len),
    }


def _engine_counters(s: EngineStats) -> dict[str, tuple[str, float]]:
    """The engine's totals since start as counters: name -> (help, value)."""
    return {
        "edge_engine_steps": ("Engine steps since start", s.total_steps),
        "edge_engine_tokens_decoded": ("Tokens generated since start", s.total_tokens_decoded),
        "edge_engine_tokens_prefilled": ("Prompt tokens evaluated since start", s.total_tokens_prefilled),
        "edge_spec_drafted_tokens": ("Draft tokens verified since start", s.spec_drafted),
        "edge_spec_accepted_tokens": ("Draft tokens accepted since start", s.spec_accepted),
    }


class TalliedCounter:
    """A token counter whose increments also count toward the current request's audit line
    (`audit.tally`): the routes report usage where they already count it, once."""

    def __init__(self, counter: Counter, field: str) -> None:
        self.counter, self.field = counter, field

    def inc(self, amount: float = 1) -> None:
        self.counter.inc(amount)
        tally(**{self.field: int(amount)})


class ApiMetrics:
    def __init__(
        self,
        engine: EngineLike,
        in_flight: Callable[[], int],
        scheduler_status: Callable[[], dict[str, Any] | None] = lambda: None,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.requests = Counter(
            "edge_requests", "HTTP requests by endpoint and status", ["endpoint", "status"], registry=r
        )
        # the two token counters also count toward each request's audit line
        self.prompt_tokens = TalliedCounter(Counter(
            "edge_prompt_tokens", "Prompt tokens of completed requests", registry=r), "prompt_tokens")
        self.generated_tokens = TalliedCounter(Counter(
            "edge_generated_tokens", "Tokens generated for requests", registry=r), "completion_tokens")
        self.cancelled = Counter(
            "edge_requests_cancelled", "Generations cancelled (disconnect, drain)", registry=r
        )
        self.reasoning_tokens = Counter(  # a part of edge_generated_tokens: those inside a think block
            "edge_reasoning_tokens", "Generated tokens spent thinking (think blocks, markers included)",
            registry=r)
        self.ttft = Histogram(
            "edge_ttft_seconds",
            "Time from request arrival to first token",
            buckets=TTFT_BUCKETS_S,
            registry=r,
        )
        self.token_latency = Histogram(
            "edge_token_latency_seconds",
            "Time per generated token after the first",
            buckets=TOKEN_BUCKETS_S,
            registry=r,
        )
        self.duration = Histogram(
            "edge_request_duration_seconds",
            "Generation request duration",
            buckets=(*TTFT_BUCKETS_S, 60.0, 120.0, 300.0),
            registry=r,
        )
        r.register(_LiveCollector(engine, in_flight, scheduler_status))

    def render(self) -> bytes:
        return generate_latest(self.registry)
