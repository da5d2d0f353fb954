#!/usr/bin/env python
"""A soak of mixed traffic against `edge serve`, watching resident memory (issue 34).

Several clients for `--minutes`: chat completions on ever new prompts (so prompt caches keep
moving to host memory until `--prompt-cache-mib` is full), streams dropped midway, embeddings,
and now and then a long prompt. The server's RSS (process tree) and its prompt-cache bytes
(`/v1/status`) are sampled every 5 s. The figure that matters: RSS growth over the last
`--window-minutes` (after the host prompt cache filled), which should stay under 2 %.

    .venv/bin/python scripts/soak.py [MODEL] [--minutes 30] [--window-minutes 20] [--clients 4]
        [--port 18650] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
WORDS = ["river", "stone", "lamp", "orbit", "maple", "quiet", "copper", "ladder", "violet", "harbor",
         "meadow", "signal", "canvas", "ember", "glacier", "lantern", "pepper", "saddle", "thunder",
         "velvet", "whisper", "marble", "falcon", "garden"]


def tree_rss(pid: int) -> int:
    p = psutil.Process(pid)
    return p.memory_info().rss + sum(c.memory_info().rss for c in p.children(recursive=True))


def prompt(rng: random.Random, n_words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


async def client(url: str, model: str, rng: random.Random, stop_at: float,
                 counts: dict[str, int]) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=300) as http:
        while time.monotonic() < stop_at:
            kind = rng.choices(["chat", "drop", "embed", "long"], weights=[6, 2, 2, 1])[0]
            try:
                if kind == "embed":
                    body = {"model": model, "input": [prompt(rng, 20)] * 4}
                    r = await http.post("/v1/embeddings", json=body)
                    r.raise_for_status()
                elif kind == "drop":
                    body = {"model": model, "stream": True, "max_tokens": 64,
                            "messages": [{"role": "user", "content": prompt(rng, 40)}]}
                    async with http.stream("POST", "/v1/chat/completions", json=body) as r:
                        r.raise_for_status()
                        async for _ in r.aiter_lines():
                            if rng.random() < 0.2:
                                break  # the client leaves midway
                else:
                    n = 900 if kind == "long" else rng.randint(30, 200)
                    r = await http.post("/v1/chat/completions", json={
                        "model": model, "max_tokens": rng.randint(8, 48),
                        "messages": [{"role": "user", "content": prompt(rng, n)}]})
                    r.raise_for_status()
                counts[kind] = counts.get(kind, 0) + 1
            except httpx.HTTPError:
                counts["errors"] = counts.get("errors", 0) + 1


async def sample(url: str, pid: int, stop_at: float, out: list[dict[str, float]]) -> None:
    t0 = time.monotonic()
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        while time.monotonic() < stop_at:
            eng = (await http.get("/v1/status")).json().get("engine") or {}
            out.append({"t_s": round(time.monotonic() - t0, 1), "rss_bytes": tree_rss(pid),
                        "prompt_cache_bytes": eng.get("prompt_cache_bytes", 0)})
            await asyncio.sleep(5.0)


def growth(samples: list[dict[str, float]], window_s: float) -> tuple[float, float, float]:
    """(RSS at the window's start, at the end, growth in %) over the last `window_s`."""
    end_t = samples[-1]["t_s"]
    window = [s for s in samples if s["t_s"] >= end_t - window_s]
    first = sum(s["rss_bytes"] for s in window[:6]) / len(window[:6])  # 30 s means: less noise
    last = sum(s["rss_bytes"] for s in window[-6:]) / len(window[-6:])
    return first, last, 100.0 * (last - first) / first


async def soak(args: argparse.Namespace) -> int:
    url = f"http://127.0.0.1:{args.port}"
    cmd = [sys.executable, "-m", "edge.cli", "serve", args.model, "--port", str(args.port),
           "--slots", "4", "--max-queue", "64", "--probe-interval", "0"]
    log = open(Path("/tmp") / "soak_server.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        for _ in range(600):
            try:
                if httpx.get(url + "/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.2)
        model = httpx.get(url + "/v1/models").json()["data"][0]["id"]
        stop_at = time.monotonic() + args.minutes * 60
        counts: dict[str, int] = {}
        samples: list[dict[str, float]] = []
        rng = random.Random(args.seed)
        await asyncio.gather(sample(url, proc.pid, stop_at, samples),
                             *(client(url, model, random.Random(rng.random()), stop_at, counts)
                               for _ in range(args.clients)))
    finally:
        proc.terminate()
        proc.wait(60)
    first, last, pct = growth(samples, args.window_minutes * 60)
    full = next((s["t_s"] for s in samples if s["prompt_cache_bytes"] >= 0.95 * max(
        x["prompt_cache_bytes"] for x in samples)), None)
    peak = max(s["rss_bytes"] for s in samples) / 2**20
    cache = max(s["prompt_cache_bytes"] for s in samples) / 2**20
    print(f"requests: {counts}")
    print(f"RSS start {samples[0]['rss_bytes'] / 2**20:.0f} MiB, peak {peak:.0f} MiB; "
          f"host prompt cache full at {full} s ({cache:.0f} MiB)")
    print(f"last {args.window_minutes:g} min: RSS {first / 2**20:.1f} -> {last / 2**20:.1f} MiB, "
          f"growth {pct:+.2f} %")
    if args.json:
        args.json.write_text(json.dumps({"counts": counts, "samples": samples, "growth_pct": pct}, indent=1))
    return 0 if pct < 2.0 else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    default_model = ROOT / ".cache" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    ap.add_argument("model", nargs="?", default=str(default_model))
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--window-minutes", type=float, default=20.0)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--port", type=int, default=18650)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None)
    return asyncio.run(soak(ap.parse_args()))


if __name__ == "__main__":
    raise SystemExit(main())
