#!/usr/bin/env python
"""Several models from one endpoint, measured beside llama-server's router (issue 32's table).

A store of the catalog models, requests cycling through them (a 4-token streamed chat
completion each, one client), a memory budget that holds any two of them but not all three:

- edge: `edge serve --lazy --models-dir STORE --memory-budget B --slots 2 --threads 2`
- llama-server: `llama-server --models-dir DIR --models-max 2 -np 2 -t 2` (its router: one
  child process per model; `--no-repack` added only where the build's AMX kernels would crash
  on prompt batches: backend.py amx_kernels).

Each target in its own process, started fresh per run, alternating which goes first. Per
request: time to the first streamed token, and whether the model had to be loaded. For edge
also `/api/ps` after every request (its models' planned sizes against the budget), and for
both the resident memory of the whole process tree sampled at 10 Hz against its idle value.

    .venv/bin/python scripts/bench_host.py [--runs 3] [--budget 1300M] [--models-dir .cache/models]
        [--llama-server .cache/llamacpp-tools/bin/llama-server] [--port 18600] [--json FILE] [--cold]

`--cold` drops the model files from the page cache before each target's run, so the first load
of each model reads the disk (as after a boot) while a reload after an eviction may find them
still cached: the pair the issue's "reload ≤ 0.3x its first cold load" compares.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
CYCLE = ("smollm2-135m-instruct", "gemma3-270m", "qwen2.5-coder-0.5b-instruct") * 2
ASK = [{"role": "user", "content": "Say hello."}]


@dataclass
class Req:
    model: str
    cold: bool  # the model was not resident when the request was sent
    ttft_s: float
    total_s: float
    ps_bytes: int = 0  # edge: sizes /api/ps lists after the request


@dataclass
class Run:
    target: str
    reqs: list[Req] = field(default_factory=list)
    idle_rss_bytes: int = 0
    peak_rss_bytes: int = 0
    failures: int = 0


def tree_rss(pid: int) -> int:
    try:
        p = psutil.Process(pid)
        return p.memory_info().rss + sum(c.memory_info().rss for c in p.children(recursive=True))
    except psutil.Error:
        return 0


class Sampler(threading.Thread):
    """Peak RSS of a process tree, sampled at 10 Hz."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.peak, self.stop_ev = pid, 0, threading.Event()

    def run(self) -> None:
        while not self.stop_ev.is_set():
            self.peak = max(self.peak, tree_rss(self.pid))
            self.stop_ev.wait(0.1)


def flat_dir(store: Path, names: list[str]) -> tuple[Path, dict[str, str]]:
    """The store's files by themselves, and each store name's id in llama-server's router (the
    file's stem: it names models by file)."""
    manifest = json.loads((store / "manifest.json").read_text())
    out = Path(tempfile.mkdtemp(prefix="router-models-"))
    for n in names:
        (out / manifest[n]["file"]).symlink_to((store / manifest[n]["file"]).resolve())
    return out, {n: Path(manifest[n]["file"]).stem for n in names}


def no_repack() -> list[str]:
    """llama-server's defaults, but for the flag a user whose build has the crashing AMX kernels adds."""
    from edge.runtime.llama.backend import amx_kernels, probe_backends

    return ["--no-repack"] if amx_kernels(probe_backends().system_info) else []


def start(target: str, args: argparse.Namespace, port: int, router_dir: Path) -> subprocess.Popen[bytes]:
    if target == "edge":
        cmd = [sys.executable, "-m", "edge.cli", "serve", "--lazy", "--models-dir", str(args.models_dir),
               "--memory-budget", args.budget, "--slots", "2", "--threads", str(args.threads),
               "--host", "127.0.0.1", "--port", str(port)]
    else:
        cmd = [args.llama_server, "--models-dir", str(router_dir), "--models-max", "2", "-np", "2",
               "-t", str(args.threads), *no_repack(), "--host", "127.0.0.1", "--port", str(port)]
    log = open(Path(tempfile.gettempdir()) / f"bench_host_{target}.log", "wb")  # noqa: SIM115
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ})


def wait_ready(url: str, path: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + path, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise SystemExit(f"{url} not ready after {timeout_s:.0f} s")


def resident(target: str, url: str, model_id: str) -> bool:
    if target == "edge":
        return any(m["name"].startswith(model_id + ":") for m in httpx.get(url + "/api/ps").json()["models"])
    for m in httpx.get(url + "/v1/models", timeout=10).json()["data"]:
        if m["id"] == model_id:
            return m.get("status", {}).get("value") == "loaded"
    return False


def ask(url: str, model_id: str) -> tuple[float, float]:
    body = {"model": model_id, "messages": ASK, "max_tokens": 4, "temperature": 0, "stream": True}
    t0 = time.perf_counter()
    ttft = -1.0
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=300) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if ttft < 0 and line.startswith("data: ") and '"content"' in line:
                ttft = time.perf_counter() - t0
    return ttft, time.perf_counter() - t0


def one_run(target: str, args: argparse.Namespace, port: int, router_dir: Path,
            router_ids: dict[str, str]) -> Run:
    proc = start(target, args, port, router_dir)
    url = f"http://127.0.0.1:{port}"
    run = Run(target)
    try:
        wait_ready(url, "/ready" if target == "edge" else "/health")
        time.sleep(1.0)
        run.idle_rss_bytes = tree_rss(proc.pid)
        sampler = Sampler(proc.pid)
        sampler.start()
        ids = {n: n for n in set(CYCLE)} if target == "edge" else router_ids
        for name in CYCLE:
            cold = not resident(target, url, ids[name])
            try:
                ttft, total = ask(url, ids[name])
            except httpx.HTTPError as exc:
                print(f"  {target} {name}: FAILED {exc}", file=sys.stderr)
                run.failures += 1
                continue
            listed = httpx.get(url + "/api/ps").json()["models"] if target == "edge" else []
            ps = sum(m["size"] for m in listed)
            run.reqs.append(Req(name, cold, ttft, total, ps))
        sampler.stop_ev.set()
        sampler.join()
        run.peak_rss_bytes = sampler.peak
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    return run


def summary(runs: list[Run], budget_bytes: int) -> None:
    def cold(target: str) -> list[float]:
        return [r.ttft_s for run in runs if run.target == target for r in run.reqs if r.cold]

    print("\n| target | cold TTFT median (s) | cold TTFT mean (s) | failures | peak RSS - idle (MiB) |")
    print("|---|---|---|---|---|")
    for target in ("edge", "llama-server"):
        mine = [r for r in runs if r.target == target]
        if not mine or not cold(target):
            continue
        over = max(r.peak_rss_bytes - r.idle_rss_bytes for r in mine) >> 20
        print(f"| {target} | {statistics.median(cold(target)):.2f} | {statistics.mean(cold(target)):.2f} | "
              f"{sum(r.failures for r in mine)} | {over} |")
    if cold("edge") and cold("llama-server"):
        ratio = statistics.median(cold("edge")) / statistics.median(cold("llama-server"))
        print(f"\nedge ÷ router, cold TTFT median: {ratio:.2f}x")
    edge = [r for r in runs if r.target == "edge"]
    if edge:
        first, again = [], []
        for run in edge:
            seen: set[str] = set()
            for r in run.reqs:
                if r.cold:
                    (again if r.model in seen else first).append(r.ttft_s)
                seen.add(r.model)
        if first and again:
            back, cold1 = statistics.mean(again), statistics.mean(first)
            print(f"edge reload < 1 min after unload ÷ first cold load: {back / cold1:.2f}x "
                  f"({back:.2f} s vs {cold1:.2f} s)")
        worst = max(r.ps_bytes for run in edge for r in run.reqs)
        peak, idle = max(r.peak_rss_bytes for r in edge), min(r.idle_rss_bytes for r in edge)
        print(f"edge /api/ps largest sum {worst >> 20} MiB of a {budget_bytes >> 20} MiB budget; "
              f"peak RSS {peak >> 20} MiB, idle {idle >> 20} MiB (limit (idle + budget) + 10 %: "
              f"{(idle + budget_bytes) * 1.1 / 2**20:.0f} MiB)")


def drop_from_page_cache(paths: list[Path]) -> None:
    """Ask the kernel to drop these files' clean pages (no root needed), so the next load of each
    reads the disk: a first load as a box just booted sees it (`--cold`)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--budget", default="1300M")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--models-dir", type=Path, default=ROOT / ".cache" / "models")
    ap.add_argument("--llama-server", default=None, help="llama-server binary (router mode); none: edge only")
    ap.add_argument("--port", type=int, default=18600)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--cold", action="store_true",
                    help="drop the GGUF files from the page cache before each target's run")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from edge.units import parse_bytes

    budget_bytes = parse_bytes(args.budget)
    router_dir, router_ids = flat_dir(args.models_dir, sorted(set(CYCLE)))
    targets = ["edge"] + (["llama-server"] if args.llama_server else [])
    runs: list[Run] = []
    for i in range(args.runs):
        for target in targets if i % 2 == 0 else targets[::-1]:
            if args.cold:
                drop_from_page_cache(sorted(p.resolve() for p in args.models_dir.glob("*.gguf")))
            run = one_run(target, args, args.port + len(runs), router_dir, router_ids)
            runs.append(run)
            print(f"run {i + 1} {target}: " + ", ".join(
                f"{r.model.split('-')[0]}{'*' if r.cold else ''} {r.ttft_s:.2f}s" for r in run.reqs) +
                f"; idle RSS {run.idle_rss_bytes >> 20} MiB, peak {run.peak_rss_bytes >> 20} MiB", flush=True)
    summary(runs, budget_bytes)
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in runs], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
