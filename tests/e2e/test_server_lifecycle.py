"""Live-server lifecycle with the real SmolLM2: queue bound, auth off loopback, SIGTERM drain,
notify messages, the systemd unit, and the one-shot `edge run`."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import REPO, LiveServer, cli_cmd, free_port

pytestmark = [pytest.mark.e2e, pytest.mark.model]
NO_EOS = {"0": -100, "1": -100, "2": -100}  # SmolLM2's end tokens banned: generations run to max_tokens


def _model(server: LiveServer, **kw: object) -> str:
    return httpx.get(server.url + "/v1/models", **kw).json()["data"][0]["id"]  # type: ignore[arg-type]


class Streamer(threading.Thread):
    """Reads one streaming completion in the background, recording every SSE block."""

    def __init__(self, server: LiveServer, max_tokens: int, model: str) -> None:
        super().__init__(daemon=True)
        self.body = {
            "model": model,
            "prompt": "Once upon a time",
            "max_tokens": max_tokens,
            "stream": True,
            "logit_bias": NO_EOS,
        }
        self.url = server.url
        self.blocks: list[str] = []
        self.first = threading.Event()
        self.status: int | None = None

    def run(self) -> None:
        with httpx.stream("POST", self.url + "/v1/completions", json=self.body, timeout=120) as r:
            self.status = r.status_code
            buf = ""
            for text in r.iter_text():
                buf += text
                while "\n\n" in buf:
                    block, buf = buf.split("\n\n", 1)
                    self.blocks.append(block)
                    self.first.set()
        self.first.set()


def test_queue_full_gives_503_with_retry_after(smollm2_path: Path, start_server) -> None:
    server = start_server(
        smollm2_path, "--slots", "1", "--max-queue", "0", "--threads", "1", "--no-scheduler"
    )
    model = _model(server)
    long = Streamer(server, 400, model)
    long.start()
    assert long.first.wait(60) and long.status == 200
    r = httpx.post(
        server.url + "/v1/completions", json={"model": model, "prompt": "x", "max_tokens": 2}, timeout=30
    )
    assert r.status_code == 503
    assert int(r.headers["Retry-After"]) >= 1
    assert r.json()["error"]["code"] == "queue_full"
    metrics = httpx.get(server.url + "/metrics").text
    assert 'edge_requests_total{endpoint="/v1/completions",status="503"} 1.0' in metrics


def test_auth_required_on_non_loopback_bind(smollm2_path: Path, start_server, tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("e2e-secret\n")
    server = start_server(
        smollm2_path, "--api-key-file", str(key_file), "--threads", "1", "--no-scheduler", host="0.0.0.0"
    )
    # connect via loopback only
    assert httpx.get(server.url + "/health").status_code == 200
    r = httpx.get(server.url + "/v1/models")
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert httpx.get(server.url + "/v1/models", headers={"Authorization": "Bearer nope"}).status_code == 401
    ok = httpx.get(server.url + "/v1/models", headers={"Authorization": "Bearer e2e-secret"})
    assert ok.status_code == 200


def test_non_loopback_bind_without_key_is_refused(smollm2_path: Path, tmp_path: Path) -> None:
    res = subprocess.run(
        cli_cmd(
            "serve", str(smollm2_path), "--host", "0.0.0.0", "--port", str(free_port()), "--no-scheduler"
        ),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "EDGE_MODELS_DIR": str(tmp_path)},
    )
    assert res.returncode == 2  # a configuration error (commands/exits.py)
    assert "--insecure" in res.stderr and "Traceback" not in res.stderr


def test_sigterm_drains_then_cancels_and_notifies(smollm2_path: Path, start_server) -> None:
    server = start_server(
        smollm2_path, "--slots", "2", "--threads", "1", "--no-scheduler", "--drain-timeout", "3", notify=True
    )
    server.read_notify("READY=1", timeout_s=10)
    model = _model(server)
    short, long = Streamer(server, 12, model), Streamer(server, 1500, model)
    short.start()
    long.start()
    assert short.first.wait(60) and long.first.wait(60)
    t0 = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 5
    ready = None
    while time.monotonic() < deadline:
        ready = httpx.get(server.url + "/ready", timeout=5)
        if ready.status_code == 503:
            break
        time.sleep(0.05)
    assert ready is not None and ready.status_code == 503 and "draining" in ready.json()["reason"]
    refused = httpx.post(
        server.url + "/v1/completions", json={"model": model, "prompt": "x", "max_tokens": 2}
    )
    assert refused.status_code == 503 and "Retry-After" in refused.headers
    short.join(60)
    long.join(60)
    assert server.proc.wait(60) == 0
    elapsed_s = time.monotonic() - t0
    assert elapsed_s < 20, elapsed_s
    # the short one finished normally, the long one was cancelled at the drain timeout with an error event
    assert short.blocks[-1] == "data: [DONE]"
    assert json.loads(short.blocks[-2][len("data: ") :])["choices"][0]["finish_reason"] == "length"
    assert long.blocks[-1] != "data: [DONE]"
    assert "shutting down" in long.blocks[-1]
    msgs = server.read_notify("STOPPING=1", timeout_s=5)
    assert msgs.index(next(m for m in msgs if m.startswith("READY=1"))) < msgs.index(
        next(m for m in msgs if m.startswith("STOPPING=1"))
    )


def test_edge_run_one_shot(smollm2_path: Path) -> None:
    res = subprocess.run(
        cli_cmd(
            "run",
            str(smollm2_path),
            "What is 2+2?",
            "-n",
            "12",
            "--temperature",
            "0",
            "--threads",
            "1",
            "--stats",
        ),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip()
    assert "generated" in res.stderr and "tokens/s" in res.stderr


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_service_install_writes_a_verified_unit(tmp_path: Path) -> None:
    unit = tmp_path / "edge.service"
    exe = tmp_path / "edge"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    res = subprocess.run(
        cli_cmd(
            "service",
            "install",
            "--output",
            str(unit),
            "--exec",
            str(exe),
            "--verify",
            "--models-dir",
            str(tmp_path / "models"),
        ),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "systemd-analyze verify: ok" in res.stdout
    text = unit.read_text()
    assert (
        "Type=notify" in text and "WatchdogSec=" in text and f"ReadWritePaths={tmp_path / 'models'}" in text
    )


def test_scheduler_is_wired_into_status_and_metrics(smollm2_path: Path, start_server) -> None:
    server = start_server(smollm2_path, "--threads", "1", "--telemetry", "none", "--max-queue", "4")
    model = _model(server)
    r = httpx.post(
        server.url + "/v1/chat/completions",
        timeout=120,
        json={"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
    )
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
    status = httpx.get(server.url + "/v1/status").json()
    assert status["scheduler"]["ticks"] >= 1
    assert status["scheduler"]["decision"]["mode"]
    assert status["queue"]["kind"] == "scheduler" and status["queue"]["max_queue"] == 4
    metrics = httpx.get(server.url + "/metrics").text
    assert "edge_scheduler_ticks " in metrics and "edge_knob_active_limit" in metrics
