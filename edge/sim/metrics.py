"""What one simulated run measured, and weighted percentiles to summarise it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


def weighted_percentile(samples: list[tuple[float, int]], q: float) -> float | None:
    """q in [0, 1] over (value, weight) pairs; None when empty."""
    total = sum(w for _, w in samples)
    if total <= 0:
        return None
    rank = q * total
    acc = 0
    for value, w in sorted(samples):
        acc += w
        if acc >= rank:
            return value
    return max(v for v, _ in samples)


@dataclass
class RunMetrics:
    scenario: str
    policy: str
    profile: str
    duration_s: float
    tokens: int = 0  # tokens delivered: finished requests + those still streaming at the end (not lost/shed)
    max_temp_c: float = 0.0
    seconds_above_limit_minus_3: float = 0.0
    seconds_hw_throttled: float = 0.0
    p50_token_latency_s: float | None = None
    p99_token_latency_s: float | None = None
    interactive_p99_ttft_s: float | None = None
    oom_events: int = 0
    completed: int = 0
    lost_without_error: int = 0  # in flight when the OOM killer struck: the client got nothing
    shed_with_error: int = 0
    rejected_with_error: int = 0
    unanswered_at_end: int = 0  # still queued or running when the run stopped (not lost)
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for key in ("max_temp_c", "seconds_above_limit_minus_3", "seconds_hw_throttled"):
            d[key] = round(d[key], 2)
        for key in ("p50_token_latency_s", "p99_token_latency_s", "interactive_p99_ttft_s"):
            if d[key] is not None:
                d[key] = round(d[key], 4)
        return d
