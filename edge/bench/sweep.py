"""`edge bench http MODEL --slots-sweep 1,2,4,8 --target-p90-ttft-ms T`: one ladder per slots setting.

A running server cannot change its slots, so the sweep starts `edge serve MODEL --slots S` for
each setting in turn, walks the whole concurrency ladder against it and stops it (by PID, as
`run_bench` does) before the next one starts: the settings never share the cores. The runs are
merged into one bench document whose targets are `slots=S`, so the table, the knee of each
curve, `--json` and `edge report`'s plots read it like any run; its `sweep` object adds the
points and the recommendation (rule in `recommend.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from edge.bench.recommend import label, points_of, section
from edge.bench.runner import BenchConfig, run_bench
from edge.bench.targets import TargetSpec

RunBench = Callable[..., dict[str, Any]]


def run_sweep(cfg: BenchConfig, *, run: RunBench = run_bench, **kw: Any) -> dict[str, Any]:
    """Run the ladder once per `cfg.slots_sweep` value (each on a freshly started edge) and merge.

    `run` is `runner.run_bench` (a parameter so tests need no server); `kw` goes to it."""
    assert cfg.slots_sweep and cfg.target_p90_ttft_ms is not None and cfg.model_path is not None
    runs = []
    for slots in cfg.slots_sweep:
        one = replace(cfg, primary=TargetSpec("edge", label(slots)), compare=(), slots=slots, slots_sweep=())
        runs.append((slots, run(one, **kw)))
    return merge(cfg, runs)


def _shifted(rows: list[dict[str, Any]], keys: tuple[str, ...], offset: float) -> list[dict[str, Any]]:
    return [{**r, **{k: round(r[k] + offset, 6) for k in keys if k in r}} for r in rows]


def merge(cfg: BenchConfig, runs: list[tuple[int, dict[str, Any]]]) -> dict[str, Any]:
    """One document from the per-setting runs; their clocks are laid end to end (run 2 starts
    where run 1 ended), so the timeline reads as the sweep happened."""
    assert cfg.target_p90_ttft_ms is not None
    offset = 0.0
    steps: list[dict[str, Any]] = []
    targets: list[dict[str, Any]] = []
    knee: dict[str, int | None] = {}
    timeline: dict[str, list[dict[str, Any]]] = {}
    points = []
    for slots, doc in runs:
        steps += _shifted(doc["steps"], ("started_s", "ended_s"), offset)
        targets += doc["targets"]
        knee.update(doc["knee"])
        timeline.update({k: _shifted(pts, ("t_s",), offset) for k, pts in doc["timeline"].items()})
        points += points_of(slots, doc["steps"])
        offset += doc["duration_s"]
    # the memory plan `edge report` prints is the one of the largest setting: if that fits, all do
    settings = {**cfg.to_json(), "slots": max(cfg.slots_sweep)}
    knees = {slots: knee.get(label(slots)) for slots, _ in runs}
    merged = {
        **runs[0][1], "settings": settings, "targets": targets, "steps": steps, "knee": knee,
        "compare": [], "timeline": timeline, "duration_s": round(offset, 3),
        "loadavg_1m": runs[-1][1]["loadavg_1m"],
        "failed_requests": sum(doc["failed_requests"] for _, doc in runs),
    }
    merged["sweep"] = section([s for s, _ in runs], cfg.target_p90_ttft_ms, points, knees)
    return merged
