"""Per-request results, per-step figures and the knee of the ladder (pure functions).

Percentiles are `numpy.percentile(values, q, method="linear")`: the linear
interpolation between closest ranks (numpy's default, "type 7" of Hyndman & Fan),
so P50 of [1, 2, 3, 4] is 2.5 and P90 of ten values 1..10 is 9.1. Latencies count
successful requests only; failed ones are counted, never timed.

TPOT (time per output token) of one request is `(e2e - ttft) / (n_out - 1)`: the
mean gap between tokens after the first; requests with fewer than two output
tokens have none.

Throughput is measured over the step's window: from the first start to the last
end of its measured (non-warmup) requests; requests/s counts successful ones,
output tokens/s their output tokens.

The knee: walking up the ladder, the first step i where throughput (output
tokens/s) rose less than 10 % over step i-1 while P90 latency (end-to-end or
TTFT) rose more than 25 % names the knee C[i-1]: the concurrency after which more
parallel users buy mostly waiting. None when no step does that.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from typing import Any

import numpy as np

PERCENTILES: tuple[int, ...] = (50, 90, 99)
KNEE_MIN_GAIN = 0.10  # throughput must rise at least this much (relative) to be "still rising"
KNEE_LATENCY_RISE = 0.25  # P90 latency rising more than this (relative) means requests now queue


@dataclass(frozen=True)
class RequestResult:
    """One request as the client saw it; times in seconds since the step started."""

    index: int
    warmup: bool
    start_s: float
    end_s: float
    ttft_s: float | None = None  # request sent -> first content token received
    n_out: int = 0  # output tokens: the final usage chunk, else content deltas counted
    tokens_from_usage: bool = False
    status: int | None = None  # HTTP status; None when no response came (timeout, transport)
    error: str | None = None  # None ok; "http", "timeout", "transport", "stream", "empty"
    detail: str = ""
    retries: int = 0  # sent again after the connection dropped before any answer

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def e2e_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def tpot_s(self) -> float | None:
        if self.ttft_s is None or self.n_out < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.n_out - 1)


def percentiles(values: Iterable[float], qs: Sequence[int] = PERCENTILES) -> dict[str, float | None]:
    """{"p50": ..., "p90": ..., "p99": ...} by linear interpolation; None for no values."""
    arr = np.asarray(list(values), dtype=float)
    if arr.size == 0:
        return {f"p{q}": None for q in qs}
    got = np.percentile(arr, list(qs), method="linear")
    return {f"p{q}": float(v) for q, v in zip(qs, got, strict=True)}


@dataclass(frozen=True)
class StepStats:
    """The figures of one concurrency step against one target."""

    target: str
    concurrency: int
    n_sent: int
    n_warmup: int
    n_measured: int
    n_ok: int
    n_failed: int
    failed_by_status: dict[str, int]  # HTTP status -> count (measured requests)
    n_timeouts: int
    n_transport_errors: int
    n_stream_errors: int  # an error event or a cut-off inside a 200 stream
    n_empty: int  # a complete 200 answer without any output token
    n_warmup_failed: int
    window_s: float
    requests_per_s: float
    output_tokens_per_s: float
    output_tokens: int
    tokens_from_usage: int  # measured ok requests whose count came from the usage chunk
    ttft_s: dict[str, float | None]
    tpot_s: dict[str, float | None]
    e2e_s: dict[str, float | None]
    started_s: float = 0.0  # step start, seconds since the run started (timeline alignment)
    ended_s: float = 0.0  # step end, same clock
    errors_sample: list[str] = field(default_factory=list)  # a few failure details, for the reader
    n_retried: int = 0  # measured requests sent twice: the first connection dropped unanswered

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def summarize(
    target: str,
    concurrency: int,
    results: Sequence[RequestResult],
    started_s: float = 0.0,
    ended_s: float = 0.0,
) -> StepStats:
    """Figures of one step from its requests; warmup requests are excluded from all but n_warmup*."""
    measured = [r for r in results if not r.warmup]
    warm = [r for r in results if r.warmup]
    ok = [r for r in measured if r.ok]
    failed = [r for r in measured if not r.ok]
    window_s = (max(r.end_s for r in measured) - min(r.start_s for r in measured)) if measured else 0.0
    out_tokens = sum(r.n_out for r in ok)
    by_status = Counter(str(r.status) for r in failed if r.error == "http")
    return StepStats(
        target=target,
        concurrency=concurrency,
        n_sent=len(results),
        n_warmup=len(warm),
        n_measured=len(measured),
        n_ok=len(ok),
        n_failed=len(failed),
        failed_by_status=dict(sorted(by_status.items())),
        n_timeouts=sum(r.error == "timeout" for r in failed),
        n_transport_errors=sum(r.error == "transport" for r in failed),
        n_stream_errors=sum(r.error == "stream" for r in failed),
        n_empty=sum(r.error == "empty" for r in failed),
        n_warmup_failed=sum(not r.ok for r in warm),
        n_retried=sum(r.retries > 0 for r in measured),
        window_s=window_s,
        requests_per_s=len(ok) / window_s if window_s > 0 else 0.0,
        output_tokens_per_s=out_tokens / window_s if window_s > 0 else 0.0,
        output_tokens=out_tokens,
        tokens_from_usage=sum(r.tokens_from_usage for r in ok),
        ttft_s=percentiles(r.ttft_s for r in ok if r.ttft_s is not None),
        tpot_s=percentiles(t for r in ok if (t := r.tpot_s) is not None),
        e2e_s=percentiles(r.e2e_s for r in ok),
        started_s=started_s,
        ended_s=ended_s,
        errors_sample=sorted({f"{r.error}: {r.detail}"[:200] for r in (*failed, *warm) if not r.ok})[:5],
    )


def _rise(new: float | None, old: float | None) -> float | None:
    if new is None or old is None or old <= 0:
        return None
    return new / old - 1.0


def find_knee(steps: Sequence[StepStats]) -> int | None:
    """The knee concurrency of one target's ladder (rule in the module doc), or None."""
    ladder = sorted(steps, key=lambda s: s.concurrency)
    for prev, cur in pairwise(ladder):
        gain = _rise(cur.output_tokens_per_s, prev.output_tokens_per_s)
        if gain is None or gain >= KNEE_MIN_GAIN:
            continue
        rises = (_rise(cur.e2e_s["p90"], prev.e2e_s["p90"]), _rise(cur.ttft_s["p90"], prev.ttft_s["p90"]))
        if any(r is not None and r > KNEE_LATENCY_RISE for r in rises):
            return prev.concurrency
    return None


def ratios(base: StepStats, other: StepStats) -> dict[str, float | None]:
    """other / base for throughput and P50/P90 latencies (above 1: `other` is faster, or slower)."""

    def div(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None or b == 0 else a / b

    out: dict[str, float | None] = {
        "requests_per_s": div(other.requests_per_s, base.requests_per_s),
        "output_tokens_per_s": div(other.output_tokens_per_s, base.output_tokens_per_s),
    }
    for metric in ("ttft_s", "tpot_s", "e2e_s"):
        for q in ("p50", "p90"):
            out[f"{metric}_{q}"] = div(getattr(other, metric)[q], getattr(base, metric)[q])
    return out
