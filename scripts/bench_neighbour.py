#!/usr/bin/env python
"""Threads after a real neighbour process: how soon they come back, and whether they flap (issue 35).

Starts `edge serve MODEL --threads T` on loopback (by PID), then, with a busy neighbour process
(a Python spin loop at equal priority, started and ended here by PID):

- restore: `--reps` times, the neighbour runs until the scheduler has capped edge's threads,
  then is ended; the seconds from its end until the server logs the full thread count again
  (its own log lines cost the box nothing to watch). Idle, and again while one stream decodes.
  The reps are further apart than the controller's flap window (a neighbour back within it
  counts as flapping and makes the next restore wait longer, on purpose: the case below).
- flapping: a neighbour that is busy 2 s and idle 2 s for `--flap-s` seconds; the thread-count
  changes the server logged, and how many came after the first 10 s.

Prints each figure and a Markdown summary.

    .venv/bin/python scripts/bench_neighbour.py MODEL.gguf [--threads 2] [--reps 5] [--flap-s 60]
        [--port 18740]
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

import httpx
from bench_catalog import wait_ready  # run from scripts/, like the other benches
from bench_startup import end

ROOT = Path(__file__).resolve().parents[1]
SPIN = [sys.executable, "-c", "while True: pass"]
# busy 2 s, idle 2 s, forever (ended by PID)
FLAPPER = [sys.executable, "-c", "import time\nwhile True:\n t = time.monotonic()\n"
           " while time.monotonic() - t < 2: pass\n time.sleep(2)"]


_CHANGE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*edge\.scheduler: .*?(\d+) -> (\d+) threads")


def changes(log: Path) -> list[tuple[float, int]]:
    """(wall time, threads after) of each thread change the server logged: watching the log costs
    the box nothing, where polling /v1/status fast enough to time a restore is itself a neighbour."""
    out = []
    for line in log.read_text(errors="replace").splitlines():
        m = _CHANGE.match(line)
        if m:
            t = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            out.append((t, int(m.group(3))))
    return out


def wait_for(log: Path, want: int, since: float, timeout_s: float) -> float | None:
    """Wall time of the first change to `want` threads logged after `since` (None: none in time)."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        hits = [t for t, n in changes(log) if n == want and t >= since]
        if hits:
            return hits[0]
        time.sleep(0.1)
    return None


class Decoder(threading.Thread):
    """One stream decoding for as long as it runs (long completions); a failed request ends it
    (retrying at once would make this process the busy neighbour)."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.stop, self.tokens = url, threading.Event(), 0
        self.error: Exception | None = None

    def run(self) -> None:
        model = httpx.get(self.url + "/v1/models", timeout=10).json()["data"][0]["id"]
        body = {"model": model, "prompt": "Here is a very long story about a lighthouse keeper.\n\n",
                "max_tokens": 400, "temperature": 0.8}
        while not self.stop.is_set():
            try:
                r = httpx.post(self.url + "/v1/completions", json=body, timeout=120)
                r.raise_for_status()
                self.tokens += int(r.json()["usage"]["completion_tokens"])
            except (httpx.HTTPError, KeyError, ValueError) as exc:
                self.error = exc
                return


def restore_delays(log: Path, full: int, reps: int, gap_s: float) -> list[float]:
    out = []
    for _ in range(reps):
        started = time.time()
        spin = subprocess.Popen(SPIN)
        try:
            if wait_for(log, full - 1, started, 20.0) is None:
                raise RuntimeError("the scheduler never capped the threads beside a busy neighbour")
        finally:
            end(spin)
        ended = time.time()
        back = wait_for(log, full, ended, 30.0)
        if back is None:
            raise RuntimeError("threads did not come back within 30 s")
        out.append(back - ended)
        print(f"  threads back {back - ended:.2f} s after the neighbour ended", flush=True)
        time.sleep(gap_s)
    return out


def flapping(log: Path, seconds: float) -> tuple[int, int]:
    """(thread-count changes, of which after the first 10 s) beside a 2 s on / 2 s off neighbour."""
    t0 = time.time()
    flap = subprocess.Popen(FLAPPER)
    try:
        time.sleep(seconds)
    finally:
        end(flap)
    seen = [t - t0 for t, _ in changes(log) if t0 <= t <= t0 + seconds]
    return len(seen), sum(1 for t in seen if t > 10.0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", type=Path)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--flap-s", type=float, default=60.0)
    p.add_argument("--port", type=int, default=18740)
    a = p.parse_args(argv)
    a.model = a.model.resolve()  # the server runs from the repository root
    url = f"http://127.0.0.1:{a.port}"
    from edge.scheduler.state import ControllerConfig

    gap_s = ControllerConfig().contention_flap_s + 1.0
    log = Path(tempfile.mkdtemp(prefix="bench-neighbour-")) / "serve.log"
    server = subprocess.Popen([sys.executable, "-m", "edge.cli", "serve", str(a.model), "--host", "127.0.0.1",
                               "--port", str(a.port), "--threads", str(a.threads)],
                              stdout=subprocess.DEVNULL, stderr=log.open("wb"), cwd=ROOT)
    rows = []
    try:
        wait_ready(url, "/ready", server)
        time.sleep(2.0)  # the start's own work done
        print("idle:", flush=True)
        idle = restore_delays(log, a.threads, a.reps, gap_s)
        rows.append(("restore, idle", idle))
        print("decoding one stream:", flush=True)
        dec = Decoder(url)
        dec.start()
        try:
            time.sleep(2.0)
            busy = restore_delays(log, a.threads, a.reps, gap_s)
            rows.append(("restore, one stream decoding", busy))
        finally:
            dec.stop.set()
            dec.join(120)
        if dec.error is not None or dec.tokens == 0:
            raise RuntimeError(f"the decoding stream failed: {dec.error}")
        n, late = flapping(log, a.flap_s)
        print(f"flapping neighbour (2 s on / 2 s off, {a.flap_s:.0f} s): {n} thread changes, "
              f"{late} after 10 s")
    finally:
        end(server)
    print("\n| case | threads back after the neighbour ends: mean (max) s |\n|---|---|")
    for name, xs in rows:
        print(f"| {name} | {statistics.fmean(xs):.2f} ({max(xs):.2f}) |")
    print(f"| 2 s on / 2 s off neighbour, {a.flap_s:.0f} s | {n} changes, {late} after the first 10 s |")
    return 0



if __name__ == "__main__":
    sys.exit(main())
