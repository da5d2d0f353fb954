#!/usr/bin/env python
"""Start-up and reload, measured: process start to first token, and a model's return after an unload.

For each model and run, each target in its own fresh process, interleaved (each `--edge` tree,
then llama-server when `--llama-server PATH` is given, then the next model, then the next run):

- ready: process start until the server says it is ready (edge `/ready`, llama-server `/health`);
- first token: process start until the first streamed token of a chat completion
  (`max_tokens` 1) sent as soon as the server is ready;
- edge only: the first token of a second request (warm); then an unload by Ollama's
  `/api/generate {"prompt": "", "keep_alive": 0}` and the time from a new chat request to its
  first token (the reload included), against the same process's cold first token (`reload / cold`).

ggml's repacked weight buffers: `--repack auto` leaves each on its own default (llama-server
repacks, edge keeps the weights mapped on x86: backend.py), except that llama-server gets
`--no-repack` where the build has the AMX kernels that crash; `on`/`off` force both alike. Prints
the per-run figures and a Markdown table of the means (medians). Servers are started and ended
here, by PID; ports from `--port` up.

An edge start reuses what the last start of the same command line recorded (early weights,
context and chat head: runtime/llama/early.py). `--fresh starts` runs each edge start without
the records of command lines (a command line never run here, naming a model file that ran
before); `--fresh pulled` with an empty cache but for edge's GGUF checks (a new machine where
`edge pull` fetched the model: the store keeps the check it ran); `--fresh all` with an empty
cache (a new machine, a model file copied in).

    .venv/bin/python scripts/bench_startup.py MODEL.gguf [MODEL.gguf ...] [--runs 3] [--threads 2]
        [--port 18500] [--llama-server .cache/llamacpp-tools/bin/llama-server]
        [--repack auto|on|off] [--settle S] [--fresh none|starts|pulled|all]
        [--edge before=/tmp/old-tree --edge after=.]
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
POLL_S = 0.01
TIMEOUT_S = 120.0


@dataclass
class Run:
    target: str
    model: str
    ready_s: float
    first_token_s: float
    reload_s: float | None = None  # edge: chat request after an unload -> its first token
    extra: dict[str, float] = field(default_factory=dict)


def _get(port: int, path: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


def _post(port: int, path: str, body: dict) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT_S)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def wait_ready(port: int, path: str, proc: subprocess.Popen[bytes], t0: float) -> float:
    """Seconds from `t0` until GET `path` answers 200 (the process must stay alive)."""
    while time.perf_counter() - t0 < TIMEOUT_S:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before it was ready")
        try:
            if _get(port, path) == 200:
                return time.perf_counter() - t0
        except OSError:
            pass
        time.sleep(POLL_S)
    raise TimeoutError(f"not ready after {TIMEOUT_S:.0f} s")


def first_token(port: int, model: str, t0: float) -> float:
    """Seconds from `t0` until the first streamed token of a one-token chat completion."""
    body = {"model": model, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 1,
            "temperature": 0, "stream": True}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT_S)
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"chat completion: HTTP {resp.status}: {resp.read()[:200]!r}")
        got = None
        for raw in resp:
            line = raw.strip()
            if not line.startswith(b"data:") or line == b"data: [DONE]":
                continue
            delta = json.loads(line[5:])["choices"][0].get("delta", {}) if b'"choices"' in line else {}
            if got is None and delta.get("content"):
                got = time.perf_counter() - t0
        return got if got is not None else time.perf_counter() - t0  # an empty token: the stream's end
    finally:
        conn.close()


def repack_env(repack: str) -> dict[str, str]:
    """edge's side of `--repack`: auto leaves edge's own choice (backend.py), on/off forces it."""
    return {} if repack == "auto" else {"EDGE_LLAMA_EXTRA_BUFFERS": "1" if repack == "on" else "0"}


def llama_server_repacks(repack: str) -> bool:
    """Whether llama-server runs with its repacked weight buffers: its default unless forced, or
    where this build's AMX kernels would crash it."""
    if repack != "auto":
        return repack == "on"
    from edge.runtime.llama.backend import amx_kernels, probe_backends

    return not amx_kernels(probe_backends().system_info)


def spawn(argv: list[str], env: dict[str, str]) -> tuple[subprocess.Popen[bytes], float]:
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, t0


def end(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# runs `edge.cli` from the tree under argv[1], whatever edge is installed (an editable install's
# finder would otherwise win over sys.path)
_FROM_TREE = ("import runpy, sys; root = sys.argv.pop(1); sys.meta_path[:] = [f for f in sys.meta_path "
              "if 'editable' not in repr(f)]; sys.path.insert(0, root); "
              "runpy.run_module('edge.cli', run_name='__main__', alter_sys=True)")


def run_edge(label: str, root: Path, model: Path, port: int, threads: int, extra: list[str],
             settle_s: float = 0.0, env: dict[str, str] | None = None) -> Run:
    argv = [sys.executable, "-c", _FROM_TREE, str(root), "serve", str(model), "--port", str(port),
            "--threads", str(threads), *extra]
    proc, t0 = spawn(argv, {**os.environ, **(env or {})})
    try:
        ready = wait_ready(port, "/ready", proc, t0)
        name = model.name.removesuffix(".gguf")
        cold = first_token(port, name, t0)
        warm = first_token(port, name, time.perf_counter())
        status, text = _post(port, "/api/generate", {"model": name, "prompt": "", "keep_alive": 0})
        if status != 200:
            raise RuntimeError(f"unload: HTTP {status}: {text[:200]!r}")
        reload = first_token(port, name, time.perf_counter())
        time.sleep(settle_s)  # idle: the probes edge defers past ready run and are kept
        return Run(label, model.name, ready, cold, reload, {"warm": warm})
    finally:
        end(proc)


def run_llama_server(binary: str, model: Path, port: int, threads: int, repack: bool) -> Run:
    argv = [binary, "-m", str(model), "--port", str(port), "--host", "127.0.0.1", "-t", str(threads)]
    proc, t0 = spawn(argv if repack else [*argv, "--no-repack"], dict(os.environ))
    try:
        ready = wait_ready(port, "/health", proc, t0)
        return Run("llama-server", model.name, ready, first_token(port, model.name, t0))
    finally:
        end(proc)


def _stat(xs: list[float]) -> str:
    """Mean (median) of `xs`: the median shows what one slow run did to the mean."""
    return f"{statistics.fmean(xs):.2f} ({statistics.median(xs):.2f})" if xs else "-"


def table(runs: list[Run]) -> str:
    rows = ["| model | target | ready s | first token s | reload first token s | reload / cold |",
            "|---|---|---|---|---|---|"]
    for model in dict.fromkeys(r.model for r in runs):
        for target in dict.fromkeys(r.target for r in runs):
            rs = [r for r in runs if r.model == model and r.target == target]
            if not rs:
                continue
            reloads = [r.reload_s for r in rs if r.reload_s is not None]
            ratio = [r.reload_s / r.first_token_s for r in rs if r.reload_s is not None]
            rows.append(f"| {model} | {target} | {_stat([r.ready_s for r in rs])} | "
                        f"{_stat([r.first_token_s for r in rs])} | {_stat(reloads)} | {_stat(ratio)} |")
    return "\n".join(rows) + "\n\nmean (median) of the runs"


@contextlib.contextmanager
def fresh_cache(kind: str) -> Iterator[dict[str, str]]:
    """The environment of an edge start under `--fresh`: a temporary EDGE_CACHE_DIR holding a copy
    of this user's cache without its command lines' start records (starts), only its GGUF checks
    (pulled: a new machine where `edge pull` fetched the model), or nothing (all); {} for none."""
    if kind == "none":
        yield {}
        return
    sys.path.insert(0, str(ROOT))
    from edge.dirs import cache_dir

    with tempfile.TemporaryDirectory(prefix="edge-fresh-") as tmp:
        cache = Path(tmp) / "cache"
        if kind == "starts" and cache_dir().is_dir():  # starts/files/: what each model file last had
            shutil.copytree(cache_dir(), cache, ignore=lambda d, names: [
                n for n in names if Path(d).name == "starts" and n.endswith(".json")])
        if kind == "pulled" and (cache_dir() / "gguf-checked").is_dir():
            shutil.copytree(cache_dir() / "gguf-checked", cache / "gguf-checked")
        yield {"EDGE_CACHE_DIR": str(cache)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="+", type=Path)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--port", type=int, default=18500)
    p.add_argument("--llama-server", default=None, metavar="PATH", help="llama-server binary to compare")
    p.add_argument("--edge-arg", action="append", default=[], help="extra flag for edge serve (repeatable)")
    p.add_argument("--settle", type=float, default=0.0, metavar="S",
                   help="leave each edge server idle S seconds before ending it (its deferred probes finish "
                   "and are kept for the next start)")
    p.add_argument("--edge", action="append", default=[], metavar="LABEL=DIR",
                   help="an edge tree to run (its `edge` package under DIR; repeatable, interleaved; "
                   "default: this checkout)")
    p.add_argument("--fresh", choices=("none", "starts", "pulled", "all"), default="none",
                   help="each edge start as the first of its command line: without the command lines' "
                   "start records (starts), with only edge's GGUF checks, as after `edge pull` on a new "
                   "machine (pulled), or with no cache at all (all)")
    p.add_argument("--repack", choices=("auto", "on", "off"), default="auto",
                   help="ggml's repacked weight buffers for both targets "
                   "(auto: each its own default, llama-server --no-repack where the build has AMX kernels)")
    a = p.parse_args(argv)
    env, repack = repack_env(a.repack), llama_server_repacks(a.repack)
    print(f"llama-server's repacked weight buffers: {'on' if repack else 'off'}", flush=True)
    edges = [(lab, Path(d)) for lab, _, d in (e.partition("=") for e in a.edge)] or [("edge", ROOT)]
    for _, root in edges:  # bytecode, as an installed wheel has it (pip compiles at install), even
        # where PYTHONDONTWRITEBYTECODE kept a checkout from caching it: 0.3 s of every start here
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(root / "edge")], check=True,
                       stdout=subprocess.DEVNULL)
    runs: list[Run] = []
    for i in range(a.runs):
        for model in a.models:
            for label, root in edges:
                with fresh_cache(a.fresh) as cache:
                    r = run_edge(label, root, model, a.port, a.threads, a.edge_arg, a.settle,
                                 {**env, **cache})
                runs.append(r)
                print(f"run {i + 1} {label} {model.name}: ready {r.ready_s:.2f} s, first token "
                      f"{r.first_token_s:.2f} s, warm {r.extra['warm']:.3f} s, reload {r.reload_s:.2f} s",
                      flush=True)
            if a.llama_server:
                r = run_llama_server(a.llama_server, model, a.port + 1, a.threads, repack)
                runs.append(r)
                print(f"run {i + 1} llama-server {model.name}: ready {r.ready_s:.2f} s, "
                      f"first token {r.first_token_s:.2f} s", flush=True)
    print()
    print(table(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
