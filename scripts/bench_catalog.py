#!/usr/bin/env python
"""Every catalog model beside llama-server: one stream, four streams, a long prompt, memory (issue 35).

Per run and model, three targets, each in its own fresh process, interleaved (the order rotates
from run to run so none always goes first):

- `edge`: `edge serve MODEL --slots 4 --ctx 8192 --threads T`, otherwise its defaults
  (adaptive speculation included);
- `edge off`: the same with `--speculative off`;
- `llama-server`: `llama-server -m MODEL -np 4 -c 8192 -t T`, otherwise its defaults
  (`--no-repack` only where the build's AMX kernels would crash: backend.amx_kernels).

Each gets one warm-up request, then:

- one stream: `--requests` free-form stories one after another (raw `/v1/completions`, no chat
  template), 200 tokens each with the end tokens banned (logit_bias -100; an answer that ends
  sooner is an error), greedy: completion tokens / wall time;
- four streams: `--requests` rounds of four such requests at once (four prompts): all
  completion tokens / wall time of the rounds;
- TTFT: a fresh 1,125-token prompt (words in an order never sent before, so no prompt cache
  helps), streamed, until its first content token; the mean of `--requests`;
- RSS: the process tree's resident memory, its peak while the target ran (sampled at 10 Hz).

Prints each run's figures, then a Markdown table of the means over runs with the ratios
edge ÷ llama-server and edge ÷ edge off (above 1: edge is faster; for TTFT and RSS below 1 is
better).

    .venv/bin/python scripts/bench_catalog.py [--models-dir .cache/models] [--runs 3] [--threads 2]
        [--requests 2] [--llama-server .cache/llamacpp-tools/bin/llama-server] [--json FILE]
        [--only NAME ...] [--paired [--gap S]]

`--paired` (run_paired): the targets side by side in time rather than one after another, for
a host that drifts; the edge targets without the scheduler there, as its docstring says why.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
from bench_host import Sampler as PeakRss  # the process tree's peak RSS at 10 Hz
from bench_host import no_repack

ROOT = Path(__file__).resolve().parents[1]
CATALOG = ("smollm2-135m-instruct", "gemma3-270m", "qwen2.5-coder-0.5b-instruct")
TARGETS = ("edge", "edge off", "llama-server")
N_TOKENS, LONG_PROMPT_TOKENS, CTX, SLOTS = 200, 1125, 8192, 4
SUBJECTS = ("a lighthouse keeper who finds a map", "a robot learning to paint",
            "two rival bakers in a small town", "a letter that arrives fifty years late",
            "a storm over a mountain village", "a child who talks to birds")
WORDS = ("river", "stone", "lamp", "orbit", "maple", "quiet", "copper", "ladder", "violet", "harbor",
         "meadow", "signal", "canvas", "ember", "glacier", "lantern", "pepper", "saddle", "thunder",
         "velvet", "whisper", "marble", "falcon", "garden")


@dataclass
class Result:
    run: int
    model: str
    target: str
    one_tok_s: float = 0.0
    four_tok_s: float = 0.0
    ttft_s: float = 0.0
    peak_rss_bytes: int = 0
    errors: list[str] = field(default_factory=list)


def command(target: str, model: Path, port: int, args: argparse.Namespace) -> tuple[list[str], str]:
    """(argv, readiness path) of a target."""
    common = ["--host", "127.0.0.1", "--port", str(port)]
    if target.startswith("edge"):
        cmd = [sys.executable, "-m", "edge.cli", "serve", str(model), "--slots", str(SLOTS),
               "--ctx", str(CTX), "--threads", str(args.threads), *common]
        return ([*cmd, "--speculative", "off"] if target == "edge off" else cmd), "/ready"
    return [args.llama_server, "-m", str(model), "-np", str(SLOTS), "-c", str(CTX),
            "-t", str(args.threads), *no_repack(), *common], "/health"


def wait_ready(url: str, path: str, proc: subprocess.Popen[bytes], timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"exited with {proc.returncode} before it was ready")
        try:
            if httpx.get(url + path, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"not ready after {timeout_s:.0f} s")


def end_tokens(model: Path) -> dict[str, int]:
    from edge.bench.workload import end_tokens as ids

    return {str(t): -100 for t in ids(model)}


def story(url: str, model_id: str, subject: str, ban: dict[str, int]) -> int:
    """A raw completion (no chat template: the servers' fallbacks differ for a model without
    one, and edge's plain transcript ends Gemma 3 270M's answers at its turn markers after a
    dozen tokens), so every target writes the same N_TOKENS."""
    body = {"model": model_id, "temperature": 0, "max_tokens": N_TOKENS, "logit_bias": ban,
            "prompt": f"Here is a long story about {subject}.\n\n"}
    r = httpx.post(url + "/v1/completions", json=body, timeout=600)
    r.raise_for_status()
    n = int(r.json()["usage"]["completion_tokens"])
    if n != N_TOKENS:
        raise ValueError(f"the answer ended after {n} of {N_TOKENS} tokens")
    return n


def streams(url: str, model_id: str, subjects: list[str], ban: dict[str, int]) -> tuple[int, float]:
    """(completion tokens, wall seconds) of the stories asked at once."""
    out: list[int] = []
    errors: list[BaseException] = []

    def one(subject: str) -> None:
        try:
            out.append(story(url, model_id, subject, ban))
        except BaseException as exc:  # re-raised below, in the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(s,)) for s in subjects]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return sum(out), time.perf_counter() - t0


def ttft(url: str, model_id: str, rng: random.Random) -> float:
    words = " ".join(rng.choice(WORDS) for _ in range(LONG_PROMPT_TOKENS))  # ~1 token each
    body = {"model": model_id, "temperature": 0, "max_tokens": 4, "stream": True, "prompt": words}
    t0 = time.perf_counter()
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            if ((json.loads(line[6:]).get("choices") or [{}])[0]).get("text"):
                return time.perf_counter() - t0
    return time.perf_counter() - t0


def measure(res: Result, url: str, ban: dict[str, int], args: argparse.Namespace) -> None:
    """`ban`: the model's end tokens, found before the target started (Gemma 3's 262k-token scan
    takes seconds of a core: done here, it was a neighbour that edge's contention control saw)."""
    model_id = warmed(url, ban)
    tokens, wall = 0, 0.0
    for i in range(args.requests):
        t0 = time.perf_counter()
        tokens += story(url, model_id, SUBJECTS[i % len(SUBJECTS)], ban)
        wall += time.perf_counter() - t0
    res.one_tok_s = tokens / wall
    tokens, wall = 0, 0.0
    for i in range(args.requests):
        n, w = streams(url, model_id, [SUBJECTS[(i + k) % len(SUBJECTS)] for k in range(4)], ban)
        tokens, wall = tokens + n, wall + w
    res.four_tok_s = tokens / wall
    rng = random.Random(f"{res.run}-{res.model}")  # the same fresh prompts for every target of a run
    res.ttft_s = statistics.mean(ttft(url, model_id, rng) for _ in range(args.requests))


class Server:
    """One target's process (its log in the temp dir) and the peak-RSS sampler of its tree."""

    def __init__(self, cmd: list[str], log_name: str) -> None:
        self.log = open(Path(tempfile.gettempdir()) / log_name, "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, cwd=ROOT)
        self.sampler = PeakRss(self.proc.pid)
        self.sampler.start()

    def stop(self) -> int:
        """End the process (by its PID) and return its tree's peak RSS."""
        self.sampler.stop_ev.set()
        self.sampler.join()
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        return self.sampler.peak


def warmed(url: str, ban: dict[str, int]) -> str:
    """The served model's id, after one warm-up request."""
    model_id = str(httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"])
    story(url, model_id, "a quiet morning", ban)
    return model_id


def run_target(run: int, name: str, model: Path, target: str, port: int,
               args: argparse.Namespace, ban: dict[str, int]) -> Result:
    res = Result(run, name, target)
    cmd, ready = command(target, model, port, args)
    server = Server(cmd, f"bench_catalog_{target.replace(' ', '_')}.log")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, ready, server.proc)
        measure(res, url, ban, args)
    except (httpx.HTTPError, RuntimeError, KeyError, ValueError) as exc:
        res.errors.append(f"{type(exc).__name__}: {exc}")
    finally:
        res.peak_rss_bytes = server.stop()
    return res


def run_paired(name: str, model: Path, args: argparse.Namespace, ban: dict[str, int]) -> list[Result]:
    """`--paired`: the three targets up at once, each in its own process, measured in turns request
    by request (the order rotating), `--gap` seconds apart, so that the host's drift between
    runs, 10-15 % on this VM, hits every target alike. The edge targets run with `--no-scheduler`
    here: the other targets' turns are a busy neighbour to them (the harness's, not the user's),
    and edge's contention control would rightly start each of its own turns on one thread."""
    rows = {(run, t): Result(run, name, t) for run in range(1, args.runs + 1) for t in TARGETS}
    servers: dict[str, Server] = {}
    urls: dict[str, tuple[str, str]] = {}
    try:
        for k, t in enumerate(TARGETS):
            cmd, ready = command(t, model, args.port + k, args)
            cmd += ["--no-scheduler"] if t.startswith("edge") else []
            servers[t] = Server(cmd, f"bench_catalog_paired_{t.replace(' ', '_')}.log")
            urls[t] = (f"http://127.0.0.1:{args.port + k}", ready)
        for t, (url, ready) in urls.items():
            wait_ready(url, ready, servers[t].proc)
            urls[t] = (url, warmed(url, ban))
        for run in range(1, args.runs + 1):
            _paired_run(run, name, urls, rows, args, ban)
    except (httpx.HTTPError, RuntimeError, KeyError, ValueError) as exc:
        for r in rows.values():
            r.errors.append(f"{type(exc).__name__}: {exc}")
    finally:
        for t, server in servers.items():
            peak = server.stop()
            for run in range(1, args.runs + 1):
                rows[(run, t)].peak_rss_bytes = peak
    return list(rows.values())


def _paired_run(run: int, name: str, urls: dict[str, tuple[str, str]], rows: dict[tuple[int, str], Result],
                args: argparse.Namespace, ban: dict[str, int]) -> None:
    """One run of `--paired`: each figure's requests in turns over the targets."""
    rngs = {t: random.Random(f"{run}-{name}") for t in TARGETS}  # the same fresh prompts for each
    sums = {(t, f): [0.0, 0.0] for t in TARGETS for f in ("one", "four", "ttft")}
    for i in range(args.requests):
        for figure in ("one", "four", "ttft"):
            for t in TARGETS[(run + i) % 3:] + TARGETS[:(run + i) % 3]:
                time.sleep(args.gap)
                url, mid = urls[t]
                acc = sums[(t, figure)]
                if figure == "one":
                    t0 = time.perf_counter()
                    acc[0] += story(url, mid, SUBJECTS[i % len(SUBJECTS)], ban)
                    acc[1] += time.perf_counter() - t0
                elif figure == "four":
                    n, w = streams(url, mid, [SUBJECTS[(i + k) % len(SUBJECTS)] for k in range(4)], ban)
                    acc[0], acc[1] = acc[0] + n, acc[1] + w
                else:
                    acc[0], acc[1] = acc[0] + ttft(url, mid, rngs[t]), acc[1] + 1
    for t in TARGETS:
        r = rows[(run, t)]
        r.one_tok_s = sums[(t, "one")][0] / sums[(t, "one")][1]
        r.four_tok_s = sums[(t, "four")][0] / sums[(t, "four")][1]
        r.ttft_s = sums[(t, "ttft")][0] / sums[(t, "ttft")][1]
        print(f"run {run} {name} {t} (paired): one {r.one_tok_s:.1f} tok/s, four {r.four_tok_s:.1f} "
              f"tok/s, TTFT {r.ttft_s:.2f} s", flush=True)


def mean_of(rows: list[Result], model: str, target: str, attr: str) -> float:
    vals = [getattr(r, attr) for r in rows if r.model == model and r.target == target and not r.errors]
    return statistics.mean(vals) if vals else 0.0


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def table(rows: list[Result], models: list[str]) -> str:
    out = ["| model | target | one stream tok/s | four streams tok/s | TTFT 1,125-token prompt s "
           "| peak RSS MiB |", "|---|---|---|---|---|---|"]
    for m in models:
        for t in TARGETS:
            out.append(f"| {m} | {t} | {mean_of(rows, m, t, 'one_tok_s'):.1f} | "
                       f"{mean_of(rows, m, t, 'four_tok_s'):.1f} | {mean_of(rows, m, t, 'ttft_s'):.2f} | "
                       f"{mean_of(rows, m, t, 'peak_rss_bytes') / 2**20:.0f} |")
        for a, b in (("edge", "llama-server"), ("edge off", "llama-server"), ("edge", "edge off")):
            cells = [ratio(mean_of(rows, m, a, k), mean_of(rows, m, b, k))
                     for k in ("one_tok_s", "four_tok_s", "ttft_s", "peak_rss_bytes")]
            out.append(f"| {m} | {a} ÷ {b} | {' | '.join(cells)} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models-dir", type=Path, default=ROOT / ".cache" / "models")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--requests", type=int, default=2, help="measured requests (or rounds) per figure")
    p.add_argument("--llama-server", default=os.environ.get("EDGE_LLAMA_SERVER")
                   or str(ROOT / ".cache" / "llamacpp-tools" / "bin" / "llama-server"))
    p.add_argument("--port", type=int, default=18700)
    p.add_argument("--only", action="append", default=[],
                   help="a catalog name (repeatable; default: all three)")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--paired", action="store_true",
                   help="all targets up at once, measured in turns request by request (run_paired)")
    p.add_argument("--gap", type=float, default=0.5, help="--paired: seconds between two requests")
    args = p.parse_args(argv)
    manifest = json.loads((args.models_dir / "manifest.json").read_text())
    models = args.only or list(CATALOG)
    rows: list[Result] = []
    bans = {name: end_tokens(args.models_dir / manifest[name]["file"]) for name in models}
    for name in models if args.paired else []:
        rows += run_paired(name, args.models_dir / manifest[name]["file"], args, bans[name])
    for run in range(1, 0 if args.paired else args.runs + 1):
        for name in models:
            path = args.models_dir / manifest[name]["file"]
            order = TARGETS[run % 3:] + TARGETS[:run % 3]
            for k, target in enumerate(order):
                r = run_target(run, name, path, target, args.port + k, args, bans[name])
                rows.append(r)
                print(f"run {run} {name} {target}: one {r.one_tok_s:.1f} tok/s, "
                      f"four {r.four_tok_s:.1f} tok/s, TTFT {r.ttft_s:.2f} s, "
                      f"peak RSS {r.peak_rss_bytes / 2**20:.0f} MiB"
                      + (f"  ERRORS {r.errors}" if r.errors else ""), flush=True)
    print()
    print(table(rows, models))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1))
    return 1 if any(r.errors for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
