"""Live-server fixtures: `edge serve` as a subprocess on loopback with a free port.

Every process is started here and ended here, by PID. `EDGE_E2E_CLI` may name
a Python script to use instead of `-m edge.cli` (development only).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]


def cli_cmd(*args: str) -> list[str]:
    override = os.environ.get("EDGE_E2E_CLI")
    base = [sys.executable, override] if override else [sys.executable, "-m", "edge.cli"]
    return [*base, *args]


def free_port(host: str = "127.0.0.1") -> int:
    """A free port: any, or the first free one of `EDGE_E2E_PORTS=LO-HI` (a machine that shares
    its loopback ports between several runs gives each its own range)."""
    lo, _, hi = os.environ.get("EDGE_E2E_PORTS", "").partition("-")
    for port in range(int(lo), int(hi) + 1) if lo and hi else [0]:
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return int(s.getsockname()[1])
    raise OSError(f"no free port in EDGE_E2E_PORTS={lo}-{hi}")


@dataclass
class LiveServer:
    proc: subprocess.Popen[str]
    url: str
    log_path: Path
    notify: socket.socket | None = None
    messages: list[str] = field(default_factory=list)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout_s: float = 180.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
            try:
                if httpx.get(self.url + "/ready", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"server not ready after {timeout_s} s:\n{self.log()[-3000:]}")

    def read_notify(self, until: str, timeout_s: float = 10.0) -> list[str]:
        """Collect notify datagrams until one starts with `until`."""
        assert self.notify is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if any(m.startswith(until) for m in self.messages):
                return self.messages
            self.notify.settimeout(max(0.05, deadline - time.monotonic()))
            try:
                self.messages.append(self.notify.recv(4096).decode())
            except TimeoutError:
                break
        raise AssertionError(f"no {until!r} among notify messages {self.messages}")

    def stop(self, timeout_s: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.notify is not None:
            self.notify.close()
        return int(self.proc.returncode)


def launch(
    tmp: Path,
    model: Path,
    *args: str,
    host: str = "127.0.0.1",
    env: dict[str, str] | None = None,
    notify: bool = False,
    wait: bool = True,
    port: int | None = None,
) -> LiveServer:
    """Start `edge serve MODEL` on a free loopback port (bind `host`), or on `port`; optionally
    with NOTIFY_SOCKET."""
    port = port or free_port("127.0.0.1")
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "EDGE_MODELS_DIR": str(tmp / "models")}
    full_env.pop("EDGE_API_KEY", None)
    full_env.update(env or {})
    sock = None
    if notify:
        sock_path = str(tmp / "notify.sock")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(sock_path)
        full_env["NOTIFY_SOCKET"] = sock_path
        full_env.setdefault("WATCHDOG_USEC", "2000000")
    log_path = tmp / "server.log"
    cmd = cli_cmd("serve", str(model), "--host", host, "--port", str(port), *args)
    with log_path.open("w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=full_env, cwd=REPO, text=True)
    server = LiveServer(proc, f"http://127.0.0.1:{port}", log_path, sock)
    if wait:
        try:
            server.wait_ready()
        except BaseException:
            server.stop(10.0)
            raise
    return server


@pytest.fixture()
def start_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """A factory; every server it starts is stopped (by PID) at the end of the test."""
    started: list[LiveServer] = []

    def start(model: Path, *args: str, **kw: object) -> LiveServer:
        server = launch(tmp_path_factory.mktemp("server"), model, *args, **kw)  # type: ignore[arg-type]
        started.append(server)
        return server

    yield start
    for s in started:
        s.stop(timeout_s=30.0)
