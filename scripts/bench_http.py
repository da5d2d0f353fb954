#!/usr/bin/env python
"""HTTP overhead benchmark: the same model through `edge serve` vs the engine called directly.

Prints, side by side from one run (measurements alternate so machine load hits both alike):
  1. one streaming request: HTTP tokens/s vs the engine's own single-sequence rate (target >= 0.95)
  2. 4 concurrent HTTP streams: aggregate tokens/s vs one HTTP stream (target >= 1.25)
  3. TTFT of a short prompt: HTTP vs the engine's own (target: within 15 ms)

The server runs as a subprocess (its own GIL) with the same settings as the in-process engine.
End-of-generation tokens are banned so every run generates exactly --tokens tokens.

    .venv/bin/python scripts/bench_http.py [MODEL] [--tokens 128] [--threads 1] [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from edge.config import Settings  # noqa: E402
from edge.runtime.types import GenerationRequest, SamplingParams  # noqa: E402

PROMPT = "Once upon a time"
SHORT_MESSAGES = [{"role": "user", "content": "Hi"}]


@dataclass
class Run:
    ttft_s: float
    n_tokens: int
    decode_s: float  # first token -> last token

    @property
    def tok_per_s(self) -> float:
        return (self.n_tokens - 1) / self.decode_s if self.decode_s > 0 else 0.0


def banned_eos(engine: object) -> dict[int, float]:
    model = engine.model  # type: ignore[attr-defined]
    ids = {getattr(model, "eos_id", None), getattr(model, "eot_id", None), 0, 1, 2}
    return {i: -100.0 for i in ids if isinstance(i, int) and i >= 0}


def engine_run(engine: object, prompt: str, n: int, bias: dict[int, float]) -> Run:
    req = GenerationRequest(
        prompt=prompt, max_tokens=n, sampling=SamplingParams(temperature=0.0, logit_bias=bias)
    )
    t0 = time.perf_counter()
    first = last = None
    count = 0
    for ev in engine.submit(req):  # type: ignore[attr-defined]
        if ev.n_tokens:
            now = time.perf_counter()
            first = first or now
            last = now
            count += ev.n_tokens
    assert first is not None and last is not None
    return Run(first - t0, count, last - first)


def http_run(url: str, model: str, n: int, bias: dict[int, float], chat: bool = False) -> Run:
    if chat:
        path, body = "/v1/chat/completions", {"messages": SHORT_MESSAGES}
    else:
        path, body = "/v1/completions", {"prompt": PROMPT}
    body.update(
        model=model,
        max_tokens=n,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        logit_bias={str(k): -100 for k in bias},
    )
    t0 = time.perf_counter()
    first = last = None
    usage = 0
    with httpx.stream("POST", url + path, json=body, timeout=300) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]["completion_tokens"]
            for c in chunk.get("choices", []):
                if c.get("text") or c.get("delta", {}).get("content"):
                    now = time.perf_counter()
                    first = first or now
                    last = now
    assert first is not None and last is not None
    return Run(first - t0, usage, last - first)


def http_ttft_raw(url: str, model: str, bias: dict[int, float]) -> float:
    """TTFT through HTTP with a minimal client (one sendall, TCP_NODELAY, no parsing library).

    httpx alone adds ~50 ms of client-side latency on this box, which would hide the server's cost.
    """
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps(
        {
            "model": model,
            "messages": SHORT_MESSAGES,
            "max_tokens": 2,
            "temperature": 0,
            "stream": True,
            "logit_bias": {str(k): -100 for k in bias},
        }
    ).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    with socket.create_connection((host, int(port))) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        t0 = time.perf_counter()
        sock.sendall(head + body)
        buf = b""
        while b'"content":"' not in buf.replace(b'"content":""', b""):
            data = sock.recv(65536)
            if not data:
                raise RuntimeError(f"connection closed before the first token: {buf[:300]!r}")
            buf += data
        return time.perf_counter() - t0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(model: Path, args: argparse.Namespace) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    cli = os.environ.get("EDGE_E2E_CLI")
    base = [sys.executable, cli] if cli else [sys.executable, "-m", "edge.cli"]
    cmd = [
        *base,
        "serve",
        str(model),
        "--port",
        str(port),
        "--slots",
        "4",
        "--ctx",
        str(args.ctx),
        "--threads",
        str(args.threads),
        "--no-scheduler",
        "--max-queue",
        "16",
    ]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}")
        try:
            if httpx.get(url + "/ready", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("server did not become ready")


def concurrent_rate(run_one: Callable[[], Run], k: int) -> float:
    """Aggregate tokens/s of k runs of `run_one` in parallel threads (engine or HTTP, same loop)."""
    runs: list[Run] = []
    lock = threading.Lock()

    def worker() -> None:
        r = run_one()
        with lock:
            runs.append(r)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(k)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(r.n_tokens for r in runs) / (time.perf_counter() - t0)


def server_ttft_s(url: str) -> tuple[float, float]:
    """(sum, count) of the server's own TTFT histogram: request arrival -> first token."""
    total = count = 0.0
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith("edge_ttft_seconds_sum"):
            total = float(line.split()[1])
        elif line.startswith("edge_ttft_seconds_count"):
            count = float(line.split()[1])
    return total, count


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "model", nargs="?", default=str(REPO / ".cache" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf")
    )
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--ctx", type=int, default=2048)
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()
    model = Path(args.model)

    from edge.host.loading import build_engine

    settings = Settings(n_ctx=args.ctx, threads=args.threads, slots=4)
    engine, _ = build_engine(model, settings)  # sized as `edge serve` sizes the server's
    engine.start()
    bias = banned_eos(engine)
    proc, url = start_server(model, args)
    try:
        model_id = httpx.get(url + "/v1/models").json()["data"][0]["id"]
        chat_prompt = engine.render_chat(SHORT_MESSAGES)
        # warm-up both paths
        engine_run(engine, PROMPT, 8, bias)
        http_run(url, model_id, 8, bias)
        eng_rates, http_rates, eng_ttft, http_ttft, aggs, eng_aggs, srv_ttft = [], [], [], [], [], [], []
        for _ in range(args.reps):  # alternate so background load affects both sides alike
            eng_rates.append(engine_run(engine, PROMPT, args.tokens, bias).tok_per_s)
            http_rates.append(http_run(url, model_id, args.tokens, bias).tok_per_s)
            # one discarded run per side: the first prefill after a multi-sequence batch is slow in the
            # engine (a one-off cost, reported separately), and TTFT here is the steady-state figure
            engine_run(engine, chat_prompt, 2, bias)
            http_ttft_raw(url, model_id, bias)
            eng_ttft.append(engine_run(engine, chat_prompt, 2, bias).ttft_s)
            s0, c0 = server_ttft_s(url)
            http_ttft.append(http_ttft_raw(url, model_id, bias))
            s1, c1 = server_ttft_s(url)
            srv_ttft.append((s1 - s0) / max(1.0, c1 - c0))
            eng_aggs.append(concurrent_rate(lambda: engine_run(engine, PROMPT, args.tokens, bias), 4))
            aggs.append(concurrent_rate(lambda: http_run(url, model_id, args.tokens, bias), 4))
        med = statistics.median
        e_rate, h_rate, agg = med(eng_rates), med(http_rates), med(aggs)
        e_ttft, h_ttft, s_ttft, e_agg = med(eng_ttft), med(http_ttft), med(srv_ttft), med(eng_aggs)
        print(f"model {model.name}, threads {args.threads}, {args.tokens} tokens, median of {args.reps}")
        print(
            f"single stream: engine {e_rate:.1f} tok/s, HTTP {h_rate:.1f} tok/s, "
            f"ratio {h_rate / e_rate:.3f} (target >= 0.95)"
        )
        print(
            f"4 concurrent HTTP streams: aggregate {agg:.1f} tok/s vs single HTTP {h_rate:.1f} tok/s, "
            f"ratio {agg / h_rate:.2f} (target >= 1.25); engine alone: 4 sequences {e_agg:.1f} tok/s, "
            f"ratio {e_agg / e_rate:.2f}"
        )
        print(
            f"TTFT short chat prompt: engine {e_ttft * 1000:.1f} ms, HTTP {h_ttft * 1000:.1f} ms, "
            f"difference {(h_ttft - e_ttft) * 1000:+.1f} ms (target <= 15 ms); inside the server "
            f"(arrival -> first token) {s_ttft * 1000:.1f} ms, {(s_ttft - e_ttft) * 1000:+.1f} ms"
        )
        print(
            f"TTFT best of {args.reps}: engine {min(eng_ttft) * 1000:.1f} ms, "
            f"HTTP {min(http_ttft) * 1000:.1f} ms, inside the server {min(srv_ttft) * 1000:.1f} ms"
        )
        print(
            "raw: engine tok/s",
            [round(x, 1) for x in eng_rates],
            "HTTP tok/s",
            [round(x, 1) for x in http_rates],
            "agg",
            [round(x, 1) for x in aggs],
            "TTFT ms engine",
            [round(x * 1000, 1) for x in eng_ttft],
            "HTTP",
            [round(x * 1000, 1) for x in http_ttft],
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        engine.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
