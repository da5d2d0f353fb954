#!/usr/bin/env python
"""Decode speed beside a busy neighbour process: edge serve (HTTP, scheduler on) vs the bare loop.

For each neighbour (none, niced, equal priority) this starts the neighbour (a busy
Python loop, ended here by PID), lets edge's scheduler see it for a few seconds,
then measures in the same minute (edge first: the bare loops are busy processes too, and
edge's scheduler would rightly see them as neighbours):
  * edge: single-stream decode over HTTP (1 / TPOT of streamed chat completions with
    the end tokens banned), the server started here on loopback by PID;
  * the bare llama_decode loop (edge/tools/bare_loop.py, own process) with
    llama.cpp's default thread wait and with OMP_WAIT_POLICY=passive.
Prints a Markdown table and the decode threads the scheduler chose.

    .venv/bin/python scripts/bench_contention.py MODEL.gguf [--threads 2] [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
BARE = REPO / "edge" / "runtime" / "bare_loop.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def process(cmd: list[str], **kw: object) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(cmd, **kw)  # type: ignore[call-overload]
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def neighbour_cmd(kind: str) -> list[str] | None:
    busy = [sys.executable, "-c", "while True: pass"]
    return {"none": None, "niced": ["nice", "-n", "19", *busy], "equal": busy}[kind]


def bare(model: str, threads: int, env: dict[str, str]) -> float:
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    out = subprocess.run([sys.executable, str(BARE), model, "--threads", str(threads), "--tokens", "128"],
                         env={**base, **env}, capture_output=True, text=True, check=True, timeout=600)
    return float(json.loads(out.stdout.strip().splitlines()[-1])["tok_s"])


def http_decode(url: str, model_id: str, ban: list[int]) -> float:
    """1 / mean inter-token gap of one streamed 128-token chat answer."""
    body = {"model": model_id, "messages": [{"role": "user", "content": "Tell me a story."}],
            "max_tokens": 128, "temperature": 0, "stream": True,
            "logit_bias": {str(t): -100 for t in ban}}
    times: list[float] = []
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=300) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: {") and '"content":"' in line and '"content":""' not in line:
                times.append(time.perf_counter())
    return (len(times) - 1) / (times[-1] - times[0])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=3)
    a = p.parse_args()
    sys.path.insert(0, str(REPO))
    from edge.bench.workload import end_tokens

    ban = list(end_tokens(a.model))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    serve = [sys.executable, "-m", "edge.cli", "serve", a.model, "--port", str(port), "--threads",
             str(a.threads), "--slots", "4"]
    rows = []
    with process(serve, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL):
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        model_id = httpx.get(url + "/v1/models").json()["data"][0]["id"]
        for kind in ("none", "niced", "equal"):
            cmd = neighbour_cmd(kind)
            with process(cmd) if cmd else _nothing():
                time.sleep(10.0)  # contention holds 2 s to drop and 5 s to restore; monitor at 1-2 Hz
                edge = [http_decode(url, model_id, ban) for _ in range(a.reps)]
                sched = httpx.get(url + "/v1/status").json().get("scheduler") or {}
                threads = (sched.get("decision") or {}).get("knobs", {}).get("n_threads")
                default = [bare(a.model, a.threads, {}) for _ in range(a.reps)]
                passive = [bare(a.model, a.threads, {"OMP_WAIT_POLICY": "passive"}) for _ in range(a.reps)]
                rows.append((kind, statistics.median(edge), statistics.median(default),
                             statistics.median(passive), threads, sched.get("cpu_contention")))
                print(kind, [round(x, 1) for x in edge], [round(x, 1) for x in default],
                      [round(x, 1) for x in passive], threads, file=sys.stderr)
    print("| neighbour | edge serve, HTTP | bare loop, default | bare loop, passive | edge / better bare "
          "| edge decode threads |")
    print("|---|---|---|---|---|---|")
    for kind, e, d, ps, thr, _c in rows:
        print(f"| {kind} | {e:.1f} | {d:.1f} | {ps:.1f} | {e / max(d, ps):.2f} | {thr} |")
    return 0


@contextmanager
def _nothing() -> Iterator[None]:
    yield


if __name__ == "__main__":
    sys.exit(main())
