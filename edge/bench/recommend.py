"""The slots sweep's recommendation: which `--slots` and `--max-queue` to serve with (pure functions).

The points: one per (slots, concurrency) step of the sweep. A point with failed requests or no
successful one is never recommended: its figures describe a server that did not keep up.

`recommend`: among the points whose P90 TTFT is within the target, the one with the most output
tokens/s; ties go to the lower P90 TTFT, then to fewer slots (less KV memory held), then to the
lower concurrency. When no point is within the target, the point with the lowest P90 TTFT
(ties: the most tokens/s), marked `met_target: false` so nobody mistakes it for an answer.

`max_queue_for`, the `--max-queue` of that point: with C clients on S slots the measurement
already held max(0, C - S) requests waiting, within the target. Each further waiting request
delays the first token of those behind it by about one service interval, 1 / (requests/s
measured there), so the headroom left, target - P90 TTFT, admits floor(headroom x requests/s)
more:

    max_queue = max(0, C - S) + floor(max(0, target - P90 TTFT) x requests/s)

Beyond that, edge answers 503 at once (a client can go elsewhere) instead of serving it late.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

RULE = ("recommended: the most output tokens/s among the points (slots, C) without failed requests "
        "whose P90 TTFT <= target (ties: lower P90 TTFT, fewer slots, lower C), else the lowest P90 "
        "TTFT, marked as missing the target; max_queue = max(0, C - slots) + "
        "floor(max(0, target - P90 TTFT) x requests/s at that point)")


def label(slots: int) -> str:
    """The target label of one slots setting in the sweep's document."""
    return f"slots={slots}"


@dataclass(frozen=True)
class SweepPoint:
    """One step of the sweep: `concurrency` clients against edge started with `--slots slots`."""

    slots: int
    concurrency: int
    output_tokens_per_s: float
    requests_per_s: float
    p90_ttft_ms: float | None
    n_failed: int = 0

    @property
    def usable(self) -> bool:
        return self.n_failed == 0 and self.p90_ttft_ms is not None and self.requests_per_s > 0


@dataclass(frozen=True)
class Recommendation:
    slots: int
    max_queue: int
    concurrency: int  # the measured point it comes from
    output_tokens_per_s: float
    p90_ttft_ms: float
    target_ms: float
    met_target: bool

    @property
    def flags(self) -> str:
        return f"--slots {self.slots} --max-queue {self.max_queue}"

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "flags": self.flags}


def max_queue_for(p: SweepPoint, target_ms: float) -> int:
    """The --max-queue of a point (rule in the module doc)."""
    assert p.p90_ttft_ms is not None
    headroom_s = max(0.0, target_ms - p.p90_ttft_ms) / 1000.0
    return max(0, p.concurrency - p.slots) + math.floor(headroom_s * p.requests_per_s + 1e-9)


def recommend(points: Iterable[SweepPoint], target_ms: float) -> Recommendation:
    """The setting to serve with (rule in the module doc); ValueError when no point is usable."""
    usable = [p for p in points if p.usable]
    if not usable:
        raise ValueError("no point of the sweep had only successful requests")
    within = [p for p in usable if p.p90_ttft_ms <= target_ms]  # type: ignore[operator]
    if within:
        best = min(within, key=lambda p: (-p.output_tokens_per_s, p.p90_ttft_ms, p.slots, p.concurrency))
    else:
        best = min(usable, key=lambda p: (p.p90_ttft_ms, -p.output_tokens_per_s, p.slots, p.concurrency))
    assert best.p90_ttft_ms is not None
    return Recommendation(best.slots, max_queue_for(best, target_ms), best.concurrency,
                          best.output_tokens_per_s, best.p90_ttft_ms, target_ms, bool(within))


def points_of(slots: int, steps: Sequence[dict[str, Any]]) -> list[SweepPoint]:
    """The sweep points of one slots setting from its steps (bench document rows)."""
    out = []
    for s in sorted(steps, key=lambda s: s["concurrency"]):
        p90 = s["ttft_s"]["p90"]
        out.append(SweepPoint(slots, s["concurrency"], s["output_tokens_per_s"], s["requests_per_s"],
                              None if p90 is None else p90 * 1000.0, s["n_failed"]))
    return out


def section(slots: Sequence[int], target_ms: float, points: list[SweepPoint],
            knees: dict[int, int | None]) -> dict[str, Any]:
    """The document's `sweep` object: settings, points, the knee per curve and the recommendation."""
    try:
        rec: dict[str, Any] | None = recommend(points, target_ms).to_json()
    except ValueError:
        rec = None
    return {"slots": list(slots), "target_p90_ttft_ms": target_ms, "rule": RULE,
            "knee": {str(s): knees.get(s) for s in slots}, "points": [asdict(p) for p in points],
            "recommendation": rec}


def recommendation_line(rec: dict[str, Any] | None) -> str:
    if rec is None:
        return "no recommendation: every point of the sweep had failed requests"
    at = f"C={rec['concurrency']}: {rec['output_tokens_per_s']:.1f} output tokens/s, " \
         f"P90 TTFT {rec['p90_ttft_ms']:.0f} ms"
    if rec["met_target"]:
        return f"recommended: {rec['flags']}  ({at} <= target {rec['target_ms']:g} ms)"
    return (f"NO POINT MET THE TARGET (P90 TTFT <= {rec['target_ms']:g} ms); lowest P90 TTFT: "
            f"{rec['flags']}  ({at}, above the target)")


def rows(sweep: dict[str, Any]) -> list[tuple[str, ...]]:
    """Per slots setting: its knee and its best point within the target."""
    target = sweep["target_p90_ttft_ms"]
    out = []
    for slots in sweep["slots"]:
        knee = sweep["knee"].get(str(slots))
        mine = [SweepPoint(**p) for p in sweep["points"] if p["slots"] == slots]
        within = [p for p in mine if p.usable and p.p90_ttft_ms <= target]  # type: ignore[operator]
        best = max(within, key=lambda p: p.output_tokens_per_s, default=None)
        cells = ("-", "-", "-") if best is None else (
            str(best.concurrency), f"{best.output_tokens_per_s:.1f}", f"{best.p90_ttft_ms:.0f}")
        out.append((str(slots), "none" if knee is None else f"C={knee}", *cells))
    return out


COLUMNS = ("slots", "knee", "best C within target", "tok/s", "P90 TTFT ms")
