"""The speculative-decoding table of the README, measured side by side in one run per workload.

    .venv/bin/python scripts/bench_speculative.py [MODEL] [--threads 2] [--requests 4] [--out DIR]

For each workload (summarise, rewrite, quote and the free-form story, one stream; the story
again at 4 streams) one `edge bench http` run starts every target in its own process and
interleaves them: edge as `edge serve` starts (speculation on) and with `--speculative off`, and
llama-server (built by scripts/build_llamacpp_tools.sh) plain and with its n-gram drafting in
the settings that did best here (LLAMA_NGRAM); on one stream also edge with `--flash-attn
fastest` (the attention kind timed faster on this CPU, no flash attention here, at the price of
greedy output that may vary with batching) beside llama-server tuned by hand the same way
(LLAMA_TUNED: no flash attention).
Greedy, 200 tokens at most, 4 slots, 4096 context, the same threads everywhere. The figures are
output tokens per second of each step (prompt processing included, as a user waits for it).
Each run's whole JSON goes to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LLAMA_SERVER = Path(os.environ.get("EDGE_LLAMA_SERVER")
                    or ROOT / ".cache" / "llamacpp-tools" / "bin" / "llama-server")
_SIMPLE = "--spec-type ngram-simple --spec-ngram-simple-size-n 3 --spec-ngram-simple-size-m"
# llama-server's n-gram drafting, the best of its spec types and sizes in a sweep on this machine
# (summarise / rewrite tok/s): ngram-simple 3/8 49.7 / 37.3, 3/16 53.6 / 37.1, 2/16 42.2 / 34.2,
# its default 12/48 38.8 / 31.3, ngram-mod 53.4 / 31.9, ngram-map-k 25.4 / 22.4, ngram-cache 20.5 / 21.1
LLAMA_NGRAM = {"3/8": f"{_SIMPLE} 8", "3/16": f"{_SIMPLE} 16", "mod": "--spec-type ngram-mod"}
LLAMA_TUNED = f"{_SIMPLE} 16 -fa off"
EDGE, EDGE_OFF, EDGE_FASTEST = "edge", "edge --speculative off", "edge --flash-attn fastest"
RUNS = (("summarise", 1), ("rewrite", 1), ("quote", 1), ("story", 1), ("story", 4))


def ls_label(flags: str) -> str:
    return f"llama-server {flags}"


def run_one(model: str, task: str, streams: int, args: argparse.Namespace, out: Path) -> dict:
    path = out / f"{task}-c{streams}.json"
    cmd = [sys.executable, "-m", "edge.cli", "bench", "http", model, "--workload", task,
           "--concurrency", str(streams), "--requests", str(args.requests * streams),
           "--warmup", str(streams), "--max-tokens", "fixed:200", "--threads", str(args.threads),
           "--slots", "4", "--ctx", "4096", "--compare", "edge:--speculative off", "--json", str(path)]
    if streams == 1 and LLAMA_SERVER.exists():
        cmd += ["--compare", "edge:--flash-attn fastest", "--compare", "llama-server"]
        for flags in (*LLAMA_NGRAM.values(), LLAMA_TUNED):
            cmd += ["--compare", f"llama-server:{flags}"]
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
    rows = [(task, streams, tok_s(run_one(args.model, task, streams, args, out))) for task, streams in RUNS]
    print("\n| workload | streams | edge off | edge | edge / off | llama-server | llama-server n-gram, best "
          "(which) | edge / that | edge, fastest attention | llama-server tuned (-fa off, 3/16) | "
          "fastest / tuned |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for task, streams, t in rows:
        on, off, fastest = t.get(EDGE, 0.0), t.get(EDGE_OFF, 0.0), t.get(EDGE_FASTEST)
        plain, tuned = t.get("llama-server"), t.get(ls_label(LLAMA_TUNED))
        ngram = {name: t[ls_label(f)] for name, f in LLAMA_NGRAM.items() if ls_label(f) in t}
        best = max(ngram, key=ngram.__getitem__) if ngram else None

        print(f"| {task} | {streams} | {off:.1f} | {on:.1f} | {_ratio(on, off)} | {_cell(plain)} | "
              f"{'-' if best is None else f'{ngram[best]:.1f} ({best})'} | "
              f"{_ratio(on, ngram[best] if best else None)} | {_cell(fastest)} | {_cell(tuned)} | "
              f"{_ratio(fastest or 0.0, tuned)} |")


def _cell(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def _ratio(a: float, b: float | None) -> str:
    return "-" if not b else f"{a / b:.2f}"


if __name__ == "__main__":
    main()
