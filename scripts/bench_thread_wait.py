#!/usr/bin/env python
"""How llama.cpp's CPU threads should wait, measured: the table behind edge/runtime/llama/threads.py.

Runs the bare decode loop (edge/tools/bare_loop.py, its own process, nothing
from edge) under each thread-wait setting, on a quiet box, beside a niced busy
process and beside an equal-priority busy process, at 2 threads and 1; with
`--llama-bench DIR` also llama.cpp's own llama-bench from other builds (e.g. one
made with -DGGML_OPENMP=OFF, ggml's own threadpool, at --poll 0/50/100). Prints a
Markdown table of the median tokens/s of `--reps` runs of `--tokens` tokens.
The busy neighbours are started and ended here, by PID.

    .venv/bin/python scripts/bench_thread_wait.py MODEL.gguf [--tokens 128] [--reps 3]
        [--llama-bench NAME=PATH ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

BARE = Path(__file__).resolve().parents[1] / "edge" / "runtime" / "bare_loop.py"
WAIT_KEYS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "EDGE_THREAD_WAIT")
VARIANTS = {
    "llama.cpp default (OpenMP spin)": {},
    "OMP_WAIT_POLICY=passive": {"OMP_WAIT_POLICY": "passive"},
    "GOMP_SPINCOUNT=10000": {"GOMP_SPINCOUNT": "10000"},
}
CONDITIONS = ("quiet", "niced busy process", "equal-priority busy process")


@contextmanager
def neighbour(kind: str) -> Iterator[None]:
    if kind == "quiet":
        yield
        return
    cmd = [sys.executable, "-c", "while True: pass"]
    if kind.startswith("niced"):
        cmd = ["nice", "-n", "19", *cmd]
    proc = subprocess.Popen(cmd)
    try:
        yield
    finally:
        proc.kill()
        proc.wait()


def base_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in WAIT_KEYS}


def bare(model: str, threads: int, tokens: int, env: dict[str, str]) -> float:
    argv = [sys.executable, str(BARE), model, "--threads", str(threads), "--tokens", str(tokens)]
    out = subprocess.run(argv, env={**base_env(), **env}, capture_output=True, text=True, check=True,
                         timeout=600)
    return float(json.loads(out.stdout.strip().splitlines()[-1])["tok_s"])


def llama_bench(binary: str, model: str, threads: int, tokens: int, poll: int) -> float:
    out = subprocess.run([binary, "-m", model, "-t", str(threads), "-p", "0", "-n", str(tokens), "-r", "1",
                          "--poll", str(poll), "-o", "json"], env=base_env(), capture_output=True, text=True,
                         check=True, timeout=600)
    return float(json.loads(out.stdout)[0]["avg_ts"])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--llama-bench", action="append", default=[], metavar="NAME=PATH")
    a = p.parse_args()
    rows: dict[str, dict[str, float]] = {}
    columns = [(c, 2) for c in CONDITIONS] + [("quiet", 1), ("equal-priority busy process", 1)]
    runs = [(name, lambda t, env=env: bare(a.model, t, a.tokens, env)) for name, env in VARIANTS.items()]
    for spec in a.llama_bench:
        name, _, path = spec.partition("=")
        for poll in (0, 50, 100):
            runs.append((f"llama-bench {name} --poll {poll}",
                         lambda t, path=path, poll=poll: llama_bench(path, a.model, t, a.tokens, poll)))
    for cond, threads in columns:
        with neighbour(cond):
            for name, fn in runs:
                vals = [fn(threads) for _ in range(a.reps)]
                rows.setdefault(name, {})[f"{cond}, {threads} thr"] = statistics.median(vals)
                print(f"{name:40s} {cond:30s} {threads} thr: {[round(v, 1) for v in vals]}", file=sys.stderr)
    heads = [f"{c}, {t} thr" for c, t in columns]
    print("| wait setting | " + " | ".join(heads) + " |")
    print("|---" * (len(heads) + 1) + "|")
    for name, vals in rows.items():
        print(f"| {name} | " + " | ".join(f"{vals[h]:.1f}" for h in heads) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
