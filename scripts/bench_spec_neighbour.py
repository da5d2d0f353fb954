#!/usr/bin/env python
"""Speculation beside a busy neighbour and in the first seconds after it stops (issue 35).

Per run, `edge serve MODEL` on its defaults (adaptive speculation) and with `--speculative off`,
each in its own process on loopback, the order alternating from run to run. For each:

- beside: a busy neighbour process (a Python spin loop at equal priority, started and ended
  here by PID) runs; after 3 s (edge's scheduler has taken a thread) `--requests` free-form
  stories, one after another (or, at four streams, `--requests` rounds of four at once);
- after: the neighbour is ended and at once `--requests` more stories or rounds (the first
  seconds after it stopped: threads coming back, the verify-cost curve measured beside it).

Each stream count in `--streams` (default 1 and 4) gets its own server process per target and
run. Stories are raw `/v1/completions`, 200 tokens with the end tokens banned, greedy (as in
bench_catalog.py); the figure is completion tokens / wall time. Prints each run and the means
with default ÷ off.

    .venv/bin/python scripts/bench_spec_neighbour.py MODEL.gguf [--runs 3] [--requests 2]
        [--streams 1,4] [--threads 2] [--port 18760]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
from bench_catalog import SUBJECTS, end_tokens, story, streams, wait_ready
from bench_neighbour import SPIN
from bench_startup import end

from edge.contracts.options import DEFAULT_SLOTS

ROOT = Path(__file__).resolve().parents[1]
TARGETS = {"edge": [], "edge off": ["--speculative", "off"]}


def stories(url: str, model_id: str, ban: dict[str, int], n: int, first: int, width: int) -> float:
    """Completion tokens / wall time of `n` rounds of `width` stories at once (one after
    another at `width` 1)."""
    t0, tokens = time.perf_counter(), 0
    for i in range(n):
        subjects = [SUBJECTS[(first + i + k) % len(SUBJECTS)] for k in range(width)]
        tokens += streams(url, model_id, subjects, ban)[0]
    return tokens / (time.perf_counter() - t0)


def run_target(model: Path, flags: list[str], a: argparse.Namespace, ban: dict[str, int],
               width: int) -> tuple[float, float]:
    """(tok/s beside the neighbour, tok/s right after it stopped)."""
    url = f"http://127.0.0.1:{a.port}"
    cmd = [sys.executable, "-m", "edge.cli", "serve", str(model), "--host", "127.0.0.1", "--port",
           str(a.port), "--threads", str(a.threads), "--slots", str(max(DEFAULT_SLOTS, width)), *flags]
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    try:
        wait_ready(url, "/ready", server)
        model_id = httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"]
        story(url, model_id, "a quiet morning", ban)  # warm-up
        spin = subprocess.Popen(SPIN)
        try:
            time.sleep(3.0)
            beside = stories(url, model_id, ban, a.requests, 0, width)
        finally:
            end(spin)
        after = stories(url, model_id, ban, a.requests, a.requests, width)
        return beside, after
    finally:
        end(server)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", type=Path)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--requests", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--port", type=int, default=18760)
    p.add_argument("--streams", default="1,4", help="stream counts, comma-separated")
    a = p.parse_args(argv)
    a.model = a.model.resolve()  # the servers run from the repository root
    widths = [int(w) for w in a.streams.split(",")]
    ban = end_tokens(a.model)  # before any server runs: the scan is a busy process of its own
    got: dict[tuple[str, int], list[tuple[float, float]]] = {(t, w): [] for t in TARGETS for w in widths}
    for run in range(a.runs):
        order = list(TARGETS) if run % 2 == 0 else list(reversed(TARGETS))
        for width in widths:
            for target in order:
                beside, after = run_target(a.model, TARGETS[target], a, ban, width)
                got[target, width].append((beside, after))
                print(f"run {run + 1} {target}, {width} stream(s): beside a neighbour {beside:.1f} "
                      f"tok/s, right after it stopped {after:.1f} tok/s", flush=True)
    print("\n| streams | edge beside / after tok/s | edge --speculative off beside / after | "
          "default ÷ off beside / after |\n|---|---|---|---|")
    for width in widths:
        on = [statistics.fmean(x[i] for x in got["edge", width]) for i in (0, 1)]
        off = [statistics.fmean(x[i] for x in got["edge off", width]) for i in (0, 1)]
        print(f"| {width} | {on[0]:.1f} / {on[1]:.1f} | {off[0]:.1f} / {off[1]:.1f} | "
              f"{on[0] / off[0]:.2f}x / {on[1] / off[1]:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
