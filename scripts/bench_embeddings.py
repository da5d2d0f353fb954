#!/usr/bin/env python
"""/v1/embeddings throughput: edge serve vs llama-server --embeddings, same model and threads.

Interleaved in one run: requests of 1 and of 16 short inputs, back to back from one
client, on each server (both started here on loopback and stopped by PID). Then, on
edge alone, a chat stream beside a steady embeddings load: the share of its decode
steps that also ran an embeddings batch (from /v1/status).

    .venv/bin/python scripts/bench_embeddings.py MODEL.gguf [--threads 2] [--requests 20]
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
LLAMA_SERVER = Path(os.environ.get("EDGE_LLAMA_SERVER", REPO / ".cache/llamacpp-tools/bin/llama-server"))
SENTENCES = [f"Sentence number {i} talks about rivers, mountains and the weather." for i in range(16)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(url: str, path: str) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + path, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"{url} not ready")


def rate(url: str, model: str, batch: int, n: int) -> float:
    body = {"model": model, "input": SENTENCES[:batch]}
    with httpx.Client(timeout=120) as c:
        c.post(url + "/v1/embeddings", json=body).raise_for_status()  # warm-up
        t0 = time.perf_counter()
        for _ in range(n):
            r = c.post(url + "/v1/embeddings", json=body)
            r.raise_for_status()
            assert len(r.json()["data"]) == batch
        return n / (time.perf_counter() - t0)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--requests", type=int, default=20)
    a = p.parse_args()
    ep, lp = free_port(), free_port()
    edge_url, llama_url = f"http://127.0.0.1:{ep}", f"http://127.0.0.1:{lp}"
    serve = [sys.executable, "-m", "edge.cli", "serve", a.model, "--port", str(ep),
             "--threads", str(a.threads), "--slots", "4"]
    edge = subprocess.Popen(serve, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    llama = None
    if LLAMA_SERVER.is_file():
        cmd = [str(LLAMA_SERVER), "-m", a.model, "-t", str(a.threads), "--embeddings", "--pooling", "mean",
               "-np", "4", "-c", "4096", "--host", "127.0.0.1", "--port", str(lp)]
        llama = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(edge_url, "/ready")
        model = httpx.get(edge_url + "/v1/models").json()["data"][0]["id"]
        if llama is not None:
            wait_ready(llama_url, "/health")
        print("| batch | edge req/s | llama-server req/s | edge / llama-server |")
        print("|---|---|---|---|")
        for batch in (1, 16):
            e = rate(edge_url, model, batch, a.requests)
            ls = rate(llama_url, "m", batch, a.requests) if llama is not None else float("nan")
            print(f"| {batch} | {e:.2f} | {ls:.2f} | {e / ls:.2f} |")
        # chat beside a steady embeddings load: how many of its steps shared an embeddings batch
        stop = threading.Event()

        def load() -> None:
            with httpx.Client(timeout=120) as c:
                while not stop.is_set():
                    c.post(edge_url + "/v1/embeddings", json={"model": model, "input": SENTENCES})

        before = httpx.get(edge_url + "/v1/status").json()["engine"]
        worker = threading.Thread(target=load)
        worker.start()
        chat = {"model": model, "messages": [{"role": "user", "content": "Tell me a story."}],
                "max_tokens": 64, "temperature": 0}
        t0 = time.perf_counter()
        httpx.post(edge_url + "/v1/chat/completions", json=chat, timeout=300).raise_for_status()
        chat_s = time.perf_counter() - t0
        after = httpx.get(edge_url + "/v1/status").json()["engine"]
        stop.set()
        worker.join()
        steps = after["total_steps"] - before["total_steps"]
        shared = after["chat_steps_with_embed"] - before["chat_steps_with_embed"]
        share = 100 * shared / max(1, steps)
        print(f"\nchat of 64 tokens beside an embeddings load: {chat_s:.1f} s; {shared} of {steps} engine "
              f"steps also ran an embeddings batch ({share:.0f} %), at most one batch each")
    finally:
        for proc in (edge, llama):
            if proc is not None:
                proc.terminate()
                proc.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
