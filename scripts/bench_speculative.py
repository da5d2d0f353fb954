"""The speculative-decoding table of the README, measured side by side in one run per workload.

    .venv/bin/python scripts/bench_speculative.py [MODEL] [--threads 2] [--requests 4] [--out DIR]

For each workload (summarise, rewrite, quote and the free-form story, one stream; the story
again at 4 streams) one `edge bench http` run starts every target in its own process and
interleaves them: edge with `--speculative off` and `ngram`, and llama-server (built by
scripts/build_llamacpp_tools.sh) plain and with its n-gram drafting. Greedy, 200 tokens at
most, 4 slots, 4096 context, the same threads everywhere. The figures are output tokens per
second of each step (prompt processing included, as a user waits for it) and the ratios of
edge's speculation to each other target. Each run's whole JSON goes to --out.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LLAMA_SERVER = ROOT / ".cache" / "llamacpp-tools" / "bin" / "llama-server"
# llama-server's n-gram drafting: its defaults (ngram-simple, 12-token lookup, 48-token drafts)
# and, the best of the few settings tried here, a 3-token lookup drafting 8 (as edge's k)
LLAMA_NGRAM = "--spec-type ngram-simple --spec-ngram-simple-size-n 3 --spec-ngram-simple-size-m 8"
EDGE_OFF, EDGE_ON = "edge --speculative off", "edge --speculative ngram"
LS_OFF, LS_ON = "llama-server", f"llama-server {LLAMA_NGRAM}"
RUNS = (("summarise", 1), ("rewrite", 1), ("quote", 1), ("story", 1), ("story", 4))


def run_one(model: str, task: str, streams: int, args: argparse.Namespace, out: Path) -> dict:
    path = out / f"{task}-c{streams}.json"
    cmd = [sys.executable, "-m", "edge.cli", "bench", "http", model, "--workload", task,
           "--concurrency", str(streams), "--requests", str(args.requests * streams),
           "--warmup", str(streams), "--max-tokens", "fixed:200", "--threads", str(args.threads),
           "--slots", "4", "--ctx", "4096", "--compare", "edge:--speculative off",
           "--compare", "edge:--speculative ngram", "--json", str(path)]
    if streams == 1 and LLAMA_SERVER.exists():
        cmd += ["--compare", "llama-server", "--compare", f"llama-server:{LLAMA_NGRAM}"]
    print("$", " ".join(cmd[2:]), flush=True)
    subprocess.run(cmd, check=False, stdout=subprocess.DEVNULL)
    return json.loads(path.read_text())


def tok_s(doc: dict) -> dict[str, float]:
    return {s["target"]: s["output_tokens_per_s"] for s in doc["steps"] if s.get("n_ok")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--requests", type=int, default=4, help="measured requests per stream")
    ap.add_argument("--out", default=str(ROOT / ".cache" / "bench-speculative"))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for task, streams in RUNS:
        t = tok_s(run_one(args.model, task, streams, args, out))
        rows.append((task, streams, t))
    print("\n| workload | streams | edge off tok/s | edge ngram tok/s | ngram / off | llama-server tok/s | "
          "llama-server ngram tok/s | edge ngram / llama-server best |")
    print("|---|---|---|---|---|---|---|---|")
    for task, streams, t in rows:
        off, on = t.get(EDGE_OFF, 0.0), t.get(EDGE_ON, 0.0)
        ls, lsn = t.get(LS_OFF), t.get(LS_ON)
        best = max(v for v in (ls, lsn) if v) if (ls or lsn) else None
        print(f"| {task} | {streams} | {off:.1f} | {on:.1f} | {on / off if off else 0:.2f} | "
              f"{'-' if ls is None else f'{ls:.1f}'} | {'-' if lsn is None else f'{lsn:.1f}'} | "
              f"{'-' if best is None else f'{on / best:.2f}'} |")


if __name__ == "__main__":
    main()
