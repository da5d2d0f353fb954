"""One `edge bench http` run: start the targets, walk the ladder interleaved, keep the document.

For each concurrency C the step runs on every target in turn (C=1 on A, C=1 on B,
C=2 on A, ...) so slow drift of the machine (heat, other load) hits all targets
alike. Edge targets are sampled (/v1/status, 1 Hz) for the whole run. Servers this
run started are stopped by PID whatever happens. The JSON document (`SCHEMA`,
`SCHEMA_VERSION`) holds the settings, the targets, every step's figures and
requests, the knee per target, the B/A ratios and the status timeline.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as _dt
import os
import platform
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
from tqdm import tqdm

from edge import __version__
from edge.bench.load import run_step, sample_status
from edge.bench.stats import (
    KNEE_LATENCY_RISE,
    KNEE_MIN_GAIN,
    RequestResult,
    StepStats,
    find_knee,
    ratios,
    summarize,
)
from edge.bench.targets import (
    Launcher,
    LaunchSettings,
    Target,
    TargetSpec,
    start_target,
    stop_process,
)
from edge.bench.workload import Workload, parse_dist

SCHEMA = "edge-bench-http"
SCHEMA_VERSION = 1
KNEE_RULE = (
    f"knee = C[i-1] for the first step i where output tokens/s rose < {KNEE_MIN_GAIN:.0%} over step i-1 "
    f"while P90 e2e or P90 TTFT rose > {KNEE_LATENCY_RISE:.0%}; null when no step does"
)


@dataclass(frozen=True)
class BenchConfig:
    """Every setting of a run; stored in the document as given."""

    primary: TargetSpec
    compare: tuple[TargetSpec, ...] = ()
    model: str | None = None  # as given (store name or path)
    model_path: Path | None = None  # resolved file, needed to start servers
    concurrency: tuple[int, ...] = (1, 2, 4, 8)
    requests: int | None = 32  # measured requests per step (after warmup); None: --duration only
    duration_s: float | None = None
    warmup: int | None = None  # None: C requests per step
    prompt_lengths: str = "uniform:32-256"
    max_tokens: str = "uniform:32-128"
    endpoint: str = "chat"
    timeout_s: float = 300.0
    threads: int = 2
    slots: int = 4
    ctx: int = 4096
    seed: int = 0
    allow_remote: bool = False
    status_interval_s: float = 1.0
    ban_tokens: tuple[int, ...] = ()  # --ignore-eos: the model's end tokens, banned in every request
    task: str = "words"  # --workload: words (random word prompts) or a task of bench/tasks.py
    settle_s: float = 0.0  # idle pause before each step (--settle)
    slots_sweep: tuple[int, ...] = ()  # --slots-sweep: one started edge per value, in turn (sweep.py)
    target_p90_ttft_ms: float | None = None  # --target-p90-ttft-ms: the sweep's latency target

    def workload(self) -> Workload:
        prompts = parse_dist(self.prompt_lengths, "prompt-lengths", allow_jsonl=True)
        return Workload(prompts, parse_dist(self.max_tokens, "max-tokens"), seed=self.seed,
                        endpoint="completions" if self.endpoint == "completions" else "chat",
                        ban_tokens=self.ban_tokens, task=self.task)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["primary"] = asdict(self.primary)
        d["compare"] = [asdict(c) for c in self.compare]
        d["model_path"] = None if self.model_path is None else str(self.model_path)
        d["concurrency"] = list(self.concurrency)
        d["slots_sweep"] = list(self.slots_sweep)
        return d


def _request_row(r: RequestResult) -> dict[str, Any]:
    return {"i": r.index, "warmup": r.warmup, "start_s": round(r.start_s, 6), "end_s": round(r.end_s, 6),
            "ttft_s": None if r.ttft_s is None else round(r.ttft_s, 6), "n_out": r.n_out,
            "usage": r.tokens_from_usage, "status": r.status, "error": r.error, "retries": r.retries}


async def _ladder(cfg: BenchConfig, targets: list[Target], workload: Workload, progress: bool,
                  now: Callable[[], float], sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                  ) -> tuple[list[tuple[StepStats, list[RequestResult]]], dict[str, list[dict[str, Any]]]]:
    top = max(cfg.concurrency) + 4
    limits = httpx.Limits(max_connections=top, max_keepalive_connections=top)
    timeout = httpx.Timeout(cfg.timeout_s)
    timelines: dict[str, list[dict[str, Any]]] = {t.label: [] for t in targets if t.is_edge}
    steps: list[tuple[StepStats, list[RequestResult]]] = []
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client, httpx.AsyncClient() as status:
        t0 = now()
        stop = asyncio.Event()
        samplers = [
            asyncio.create_task(sample_status(status, t.url, timelines[t.label], stop, t0=t0,
                                              interval_s=cfg.status_interval_s, now=now))
            for t in targets if t.is_edge
        ]
        try:
            for c in cfg.concurrency:
                warmup = c if cfg.warmup is None else cfg.warmup
                for t in targets:
                    if cfg.settle_s > 0:
                        # the cores the last step (or the servers' start) kept busy go idle before
                        # the next step: an edge target's contention stage otherwise starts it on
                        # fewer threads
                        await sleep(cfg.settle_s)
                    total = None if cfg.requests is None else warmup + cfg.requests
                    bar = tqdm(total=total, desc=f"{t.label} C={c}", unit="req", file=sys.stderr,
                               leave=False, disable=not progress)
                    started = now() - t0
                    try:
                        results = await run_step(
                            client, t.url, t.model_id, workload, c, requests=cfg.requests,
                            duration_s=cfg.duration_s, warmup=warmup, timeout_s=cfg.timeout_s, now=now,
                            on_result=lambda _r, bar=bar: bar.update(1),
                        )
                    finally:
                        bar.close()
                    steps.append((summarize(t.label, c, results, started, now() - t0), results))
        finally:
            stop.set()
            await asyncio.gather(*samplers, return_exceptions=True)
    return steps, timelines


def _labels(specs: list[TargetSpec]) -> list[TargetSpec]:
    """Unique labels (two URLs of one kind get #2, #3)."""
    seen: dict[str, int] = {}
    out = []
    for s in specs:
        n = seen[s.label] = seen.get(s.label, 0) + 1
        out.append(s if n == 1 else TargetSpec(s.kind, f"{s.label}#{n}", s.url, s.args))
    return out


def run_bench(
    cfg: BenchConfig,
    *,
    launcher: Launcher | None = None,
    progress: bool = False,
    now: Callable[[], float] = time.perf_counter,
    ready_timeout_s: float = 300.0,
    log_dir: Path | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> dict[str, Any]:
    """Run the whole ladder against every target and return the JSON document.

    `launcher` starts server processes (default: `targets.popen_launcher`, looked up at call time)."""
    from edge.bench import targets as _targets

    launch = launcher or _targets.popen_launcher
    workload = cfg.workload()  # a bad spec fails before any server starts
    settings = None
    if cfg.model_path is not None:
        from edge.runtime.llama.backend import amx_kernels, probe_backends

        settings = LaunchSettings(cfg.model_path, cfg.threads, cfg.slots, cfg.ctx,
                                  extra_buffers=not amx_kernels(probe_backends().system_info))
    created = _dt.datetime.now(_dt.timezone.utc)
    t_start = now()
    with contextlib.ExitStack() as stack:
        logs = log_dir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="edge-bench-")))
        targets: list[Target] = []
        for spec in _labels([cfg.primary, *cfg.compare]):
            t = start_target(spec, settings, logs, launcher=launch, ready_timeout_s=ready_timeout_s,
                             allow_remote=cfg.allow_remote)
            if t.process is not None:
                stack.callback(stop_process, t.process)
            targets.append(t)
        steps, timelines = asyncio.run(_ladder(cfg, targets, workload, progress, now, sleep))
    return document(cfg, [t.to_json() for t in targets], steps, timelines, created, now() - t_start)


def document(
    cfg: BenchConfig,
    targets: list[dict[str, Any]],
    steps: list[tuple[StepStats, list[RequestResult]]],
    timelines: dict[str, list[dict[str, Any]]],
    created: _dt.datetime,
    duration_s: float,
) -> dict[str, Any]:
    """The JSON document of a run (schema SCHEMA, version SCHEMA_VERSION)."""
    labels = [t["label"] for t in targets]
    by_target = {label: [s for s, _ in steps if s.target == label] for label in labels}
    compare = []
    for label in labels[1:]:
        for a, b in zip(by_target[labels[0]], by_target[label], strict=True):
            compare.append({"baseline": labels[0], "target": label, "concurrency": a.concurrency,
                            **ratios(a, b)})
    return {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "edge_version": __version__,
        "created_utc": created.isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "duration_s": round(duration_s, 3),
        # other load on the machine skews every figure; kept so a later comparison can tell
        "loadavg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "settings": cfg.to_json(),
        "targets": targets,
        "steps": [{**s.to_json(), "requests": [_request_row(r) for r in rs]} for s, rs in steps],
        "knee": {label: find_knee(ss) for label, ss in by_target.items()},
        "knee_rule": KNEE_RULE,
        "compare": compare,
        "timeline": timelines,
        "failed_requests": sum(s.n_failed + s.n_warmup_failed for s, _ in steps),
    }
