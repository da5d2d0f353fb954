"""Targets: loopback only, launch commands, start/ready/stop by PID with a fake launcher and clock."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from edge.bench.errors import TargetStartFailed, TargetUnreachable
from edge.bench.targets import (
    LaunchSettings,
    TargetSpec,
    check_loopback,
    launch_command,
    parse_target,
    probe,
    start_target,
    stop_process,
)
from edge.clock import ManualClock
from edge.errors import ConfigError

SETTINGS = LaunchSettings(Path("/models/m.gguf"), threads=3, slots=2, ctx=2048)


@pytest.mark.parametrize("url", ["http://127.0.0.1:8088", "http://localhost:1", "http://[::1]:80",
                                 "http://127.9.9.9:5"])
def test_loopback_urls_are_allowed(url: str) -> None:
    check_loopback(url)


@pytest.mark.parametrize("url", ["http://10.0.0.2:8088", "http://example.com", "http://0.0.0.0:80"])
def test_remote_urls_need_allow_remote(url: str) -> None:
    with pytest.raises(ConfigError, match="--allow-remote"):
        check_loopback(url)
    check_loopback(url, allow_remote=True)


def test_not_a_url() -> None:
    with pytest.raises(ConfigError, match="not an http"):
        check_loopback("ftp://127.0.0.1/x")


def test_parse_target() -> None:
    assert parse_target("http://127.0.0.1:9/") == TargetSpec("url", "http://127.0.0.1:9", "http://127.0.0.1:9")
    assert parse_target("llama-server") == TargetSpec("llama-server", "llama-server")
    assert parse_target("llama-cpp-python").kind == "llama-cpp-python"
    with pytest.raises(ConfigError, match="expected a URL"):
        parse_target("ollama")


def test_launch_commands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    edge = launch_command("edge", 4242, SETTINGS)
    assert edge[:4] == [sys.executable, "-m", "edge.cli", "serve"]
    assert edge[4:] == ["/models/m.gguf", "--host", "127.0.0.1", "--port", "4242", "--threads", "3",
                        "--slots", "2", "--ctx", "2048"]
    binary = tmp_path / "llama-server"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    monkeypatch.setenv("EDGE_LLAMA_SERVER", str(binary))
    assert launch_command("llama-server", 7, SETTINGS) == [
        str(binary), "-m", "/models/m.gguf", "-t", "3", "-np", "2", "-c", "2048", "--host", "127.0.0.1",
        "--port", "7"]
    lcp = launch_command("llama-cpp-python", 7, SETTINGS)
    assert lcp[:3] == [sys.executable, "-m", "llama_cpp.server"]
    assert lcp[3:] == ["--model", "/models/m.gguf", "--n_threads", "3", "--n_ctx", "2048",
                       "--interrupt_requests", "False", "--host", "127.0.0.1", "--port", "7"]
    amx = LaunchSettings(Path("/models/m.gguf"), threads=3, slots=2, ctx=2048, extra_buffers=False)
    assert launch_command("llama-server", 7, amx)[-1] == "--no-repack"
    assert "--no-repack" not in launch_command("edge", 7, amx)  # edge decides for itself


def test_missing_llama_server_is_a_config_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("EDGE_LLAMA_SERVER", str(tmp_path / "nope"))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr("edge.bench.targets.CHECKOUT", tmp_path)
    with pytest.raises(ConfigError, match="EDGE_LLAMA_SERVER"):
        launch_command("llama-server", 1, SETTINGS)


class FakeProc:
    """A process that exits with `exit_code` after `alive_polls` polls (None: runs until signalled)."""

    def __init__(self, exit_code: int | None = None, alive_polls: int = 0, ignore_term: bool = False) -> None:
        self.pid = 4321
        self.code: int | None = None
        self.exit_code, self.alive_polls, self.ignore_term = exit_code, alive_polls, ignore_term
        self.signals: list[int] = []
        self.killed = False

    def poll(self) -> int | None:
        if self.code is None and self.exit_code is not None:
            if self.alive_polls <= 0:
                self.code = self.exit_code
            self.alive_polls -= 1
        return self.code

    def send_signal(self, sig: int) -> None:
        self.signals.append(sig)
        if not self.ignore_term:
            self.code = -sig

    def wait(self, timeout: float | None = None) -> int:
        if self.code is None:
            raise subprocess.TimeoutExpired("fake", timeout or 0)
        return self.code

    def kill(self) -> None:
        self.killed = True
        self.code = -9


def _resp(status: int, body: Any = None) -> httpx.Response:
    return httpx.Response(status, json=body, request=httpx.Request("GET", "http://x"))


def fake_get(ready_after: int = 0, edge: bool = True) -> Any:
    calls: list[str] = []

    def get(url: str) -> httpx.Response:
        calls.append(url)
        if url.endswith(("/ready", "/health")):
            n = sum(u.endswith(("/ready", "/health")) for u in calls)
            if n <= ready_after:
                raise httpx.ConnectError("refused")
            return _resp(200, {"status": "ready"})
        if url.endswith("/v1/models"):
            return _resp(200, {"object": "list", "data": [{"id": "smol", "object": "model"}]})
        if url.endswith("/v1/status"):
            return _resp(200, {"scheduler": None}) if edge else _resp(404, {})
        raise AssertionError(url)

    get.calls = calls  # type: ignore[attr-defined]
    return get


def test_start_waits_for_ready_then_probes(tmp_path: Path) -> None:
    procs: list[FakeProc] = []
    cmds: list[list[str]] = []

    def launcher(cmd: list[str], log: Path) -> FakeProc:
        cmds.append(cmd)
        procs.append(FakeProc())
        return procs[-1]

    clock = ManualClock()
    t = start_target(TargetSpec("edge", "edge"), SETTINGS, tmp_path, launcher=launcher, get=fake_get(3),
                     port=lambda: 5555, clock=clock)
    assert (t.url, t.model_id, t.is_edge) == ("http://127.0.0.1:5555", "smol", True)
    assert t.to_json()["launched"] is True and t.command == cmds[0]
    assert clock.sleeps_s == [0.25, 0.25, 0.25]  # three refusals before /ready answered
    assert stop_process(procs[0]) == -signal.SIGTERM


def test_a_server_that_exits_is_a_start_failure_with_its_log(tmp_path: Path) -> None:
    def launcher(cmd: list[str], log: Path) -> FakeProc:
        log.write_text("loading...\nerror: unknown model architecture\n")
        return FakeProc(exit_code=1, alive_polls=1)

    with pytest.raises(TargetStartFailed) as err:
        start_target(TargetSpec("edge", "edge"), SETTINGS, tmp_path,
                     launcher=launcher, get=fake_get(99), port=lambda: 1, clock=ManualClock())
    assert "exited with status 1" in str(err.value)
    assert "unknown model architecture" in err.value.log_tail


def test_a_server_never_ready_is_stopped_by_pid(tmp_path: Path) -> None:
    proc = FakeProc(ignore_term=True)
    clock = ManualClock()
    with pytest.raises(TargetStartFailed, match="not ready after 2 s"):
        start_target(TargetSpec("edge", "edge"), SETTINGS, tmp_path, launcher=lambda c, p: proc,
                     get=fake_get(10**6), port=lambda: 1, clock=clock, ready_timeout_s=2.0)
    assert proc.signals == [signal.SIGTERM] and proc.killed  # SIGTERM ignored -> SIGKILL
    assert clock.monotonic() >= 2.0


def test_launching_needs_a_model(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="needs a MODEL"):
        start_target(TargetSpec("llama-server", "llama-server"), None, tmp_path,
                     launcher=lambda c, p: FakeProc())


def test_url_target_is_probed_not_launched(tmp_path: Path) -> None:
    def launcher(cmd: list[str], log: Path) -> FakeProc:
        raise AssertionError("a URL target must not start anything")

    t = start_target(TargetSpec("url", "url", "http://127.0.0.1:9"), SETTINGS, tmp_path, launcher=launcher,
                     get=fake_get(edge=False))
    assert (t.model_id, t.is_edge, t.process) == ("smol", False, None)
    with pytest.raises(ConfigError):
        start_target(TargetSpec("url", "url", "http://192.168.1.2:9"), SETTINGS, tmp_path, launcher=launcher,
                     get=fake_get())


def test_probe_errors() -> None:
    def refused(url: str) -> httpx.Response:
        raise httpx.ConnectError("connection refused")

    with pytest.raises(TargetUnreachable, match="connection refused"):
        probe("http://127.0.0.1:9", refused)
    with pytest.raises(TargetUnreachable, match="did not list a model"):
        probe("http://127.0.0.1:9", lambda url: _resp(200, {"data": []}))


def test_probe_takes_the_model_edge_serves_not_the_first_of_its_store() -> None:
    # edge lists every model of its store (loaded on demand): requesting the first one would
    # measure another model than the one the bench started it with
    listed = {"data": [{"id": "gemma3-270m"}, {"id": "smollm2-135m-instruct"}]}

    def get(url: str) -> httpx.Response:
        if url.endswith("/v1/models"):
            return _resp(200, listed)
        return _resp(200, {"scheduler": None, "model": {"id": "SmolLM2-135M-Instruct.Q4_1",
                                                       "aliases": ["smollm2-135m-instruct", "x.gguf"]}})

    assert probe("http://127.0.0.1:9", get) == ("smollm2-135m-instruct", True)
    other = {"scheduler": None, "model": {"id": "not-listed"}}
    assert probe("http://127.0.0.1:9", lambda u: _resp(200, listed if u.endswith("models") else other)) == (
        "gemma3-270m", True)
