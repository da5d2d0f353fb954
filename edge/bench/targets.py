"""What a load test measures: a server already running at a URL, or one it starts and stops itself.

Specs: an `http://` URL; `edge` (`edge serve MODEL`); `llama-server` (llama.cpp's server:
binary from EDGE_LLAMA_SERVER, else .cache/llamacpp-tools/bin/llama-server in the
checkout, else on PATH); `llama-cpp-python` (`python -m llama_cpp.server`). Started
servers bind 127.0.0.1 on a free port with the same threads, slots and context, and are
stopped by PID (SIGTERM, then SIGKILL after a timeout). Load tests target loopback only
unless the caller allows a remote host. The launcher and the clock are parameters so
tests need no real server processes.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol
from urllib.parse import urlsplit

import httpx

from edge.bench.errors import TargetStartFailed, TargetUnreachable
from edge.clock import Clock, SystemClock
from edge.errors import ConfigError

Kind = Literal["url", "edge", "llama-server", "llama-cpp-python"]
LAUNCHED_KINDS: tuple[str, ...] = ("edge", "llama-server", "llama-cpp-python")
CHECKOUT = Path(__file__).resolve().parents[2]
READY_PATHS = {"edge": "/ready", "llama-server": "/health", "llama-cpp-python": "/v1/models"}


class ServerProcess(Protocol):
    """The part of `subprocess.Popen` the bench uses."""

    pid: int

    def poll(self) -> int | None: ...

    def send_signal(self, sig: int) -> None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def kill(self) -> None: ...


Launcher = Callable[[list[str], Path], ServerProcess]


def popen_launcher(cmd: list[str], log_path: Path) -> ServerProcess:
    """Production launcher: the command as a child process, stdout+stderr to `log_path`."""
    with log_path.open("w") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})


@dataclass(frozen=True)
class TargetSpec:
    kind: Kind
    label: str
    url: str | None = None
    args: tuple[str, ...] = ()  # extra flags for a launched server (`KIND:FLAGS`)


def parse_target(text: str) -> TargetSpec:
    """A --compare value: a URL, or `edge`, `llama-server`, `llama-cpp-python`, each optionally
    with extra server flags after a colon (`edge:--speculative off`,
    `llama-server:--spec-type ngram-simple`)."""
    t = text.strip()
    if t.startswith(("http://", "https://")):
        return TargetSpec("url", t.rstrip("/"), t.rstrip("/"))
    kind, sep, flags = t.partition(":")
    if kind in LAUNCHED_KINDS:
        try:
            args = tuple(shlex.split(flags)) if sep else ()
        except ValueError as exc:
            raise ConfigError("compare", f"{text!r}: {exc}") from None
        return TargetSpec(kind, f"{kind} {' '.join(args)}" if args else kind, args=args)  # type: ignore[arg-type]
    raise ConfigError("compare", f"{text!r}: expected a URL, edge, llama-server or llama-cpp-python")


def check_loopback(url: str, allow_remote: bool = False) -> None:
    """Load tests hit loopback only, unless explicitly allowed: a ConfigError otherwise."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError("url", f"{url!r} is not an http(s) URL")
    host = parts.hostname
    if host == "localhost" or allow_remote:
        return
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ConfigError("url", f"{host} is not a loopback address; pass --allow-remote to load-test it")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def llama_server_binary() -> Path:
    env = os.environ.get("EDGE_LLAMA_SERVER")
    candidates = [Path(env)] if env else []
    candidates.append(CHECKOUT / ".cache" / "llamacpp-tools" / "bin" / "llama-server")
    found = shutil.which("llama-server")
    if found:
        candidates.append(Path(found))
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return c
    raise ConfigError("compare", "llama-server binary not found: set EDGE_LLAMA_SERVER or build "
                                 ".cache/llamacpp-tools/bin/llama-server")


@dataclass(frozen=True)
class LaunchSettings:
    """The same settings for every server a run starts, so the comparison is fair."""

    model_path: Path
    threads: int
    slots: int
    ctx: int
    # ggml's extra CPU buffers (AMX tiles, repacked weights): llama.cpp's default, except where the
    # build's AMX kernels crash (runtime/llama/backend.py amx_kernels): llama-server gets --no-repack
    # then (the flag a user who hit the crash would add)
    extra_buffers: bool = True


def launch_command(kind: str, port: int, s: LaunchSettings) -> list[str]:
    m, t, p = str(s.model_path), str(s.threads), str(port)
    if kind == "edge":
        return [sys.executable, "-m", "edge.cli", "serve", m, "--host", "127.0.0.1", "--port", p,
                "--threads", t, "--slots", str(s.slots), "--ctx", str(s.ctx)]
    if kind == "llama-server":
        repack = [] if s.extra_buffers else ["--no-repack"]
        return [str(llama_server_binary()), "-m", m, "-t", t, "-np", str(s.slots), "-c", str(s.ctx),
                "--host", "127.0.0.1", "--port", p, *repack]
    if kind == "llama-cpp-python":
        # by default its server ends the running stream when a new request arrives (an empty 200):
        # a load test needs requests to queue instead
        return [sys.executable, "-m", "llama_cpp.server", "--model", m, "--n_threads", t,
                "--n_ctx", str(s.ctx), "--interrupt_requests", "False", "--host", "127.0.0.1", "--port", p]
    raise ValueError(f"not a launchable target: {kind}")


@dataclass
class Target:
    """A server under test, ready for requests."""

    label: str
    kind: Kind
    url: str
    model_id: str = ""
    is_edge: bool = False
    command: list[str] | None = None
    process: ServerProcess | None = field(default=None, repr=False)
    log_path: Path | None = None

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, "kind": self.kind, "url": self.url, "model_id": self.model_id,
                "is_edge": self.is_edge, "launched": self.process is not None, "command": self.command}


def probe(url: str, get: Callable[[str], httpx.Response]) -> tuple[str, bool]:
    """(model id to request, whether the server is edge: it answers /v1/status).

    The first model /v1/models lists, except on edge: it lists every model of its store too (loaded
    on demand), so the id is the listed one that /v1/status names as its served model (id, name or
    alias): the model the bench started it with."""
    try:
        resp = get(url + "/v1/models")
        resp.raise_for_status()
        ids = [str(m["id"]) for m in resp.json()["data"]]
        model_id = ids[0]
    except httpx.HTTPError as exc:
        raise TargetUnreachable(url, f"GET /v1/models: {type(exc).__name__}: {exc}") from None
    except (ValueError, KeyError, IndexError, TypeError):
        raise TargetUnreachable(url, "GET /v1/models did not list a model (not OpenAI-compatible?)") from None
    try:
        st = get(url + "/v1/status")
        body = st.json() if st.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        body = None
    is_edge = isinstance(body, dict) and "scheduler" in body
    if is_edge and isinstance(model := body.get("model"), dict):
        names = {model.get("id"), model.get("name"), *(model.get("aliases") or [])}
        model_id = next((i for i in ids if i in names), model_id)
    return model_id, is_edge


def _http_get(url: str) -> httpx.Response:
    return httpx.get(url, timeout=5.0)


def _tail(path: Path | None, n: int = 20) -> str:
    if path is None or not path.is_file():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-n:])


def stop_process(proc: ServerProcess, timeout_s: float = 30.0) -> int | None:
    """SIGTERM, then SIGKILL after `timeout_s`; only ever the process this bench started."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10.0)
    return proc.poll()


def start_target(
    spec: TargetSpec,
    settings: LaunchSettings | None,
    log_dir: Path,
    *,
    launcher: Launcher = popen_launcher,
    get: Callable[[str], httpx.Response] = _http_get,
    port: Callable[[], int] = free_port,
    clock: Clock | None = None,
    ready_timeout_s: float = 300.0,
    allow_remote: bool = False,
) -> Target:
    """A ready Target: a URL is probed; anything else is launched, waited for, then probed."""
    if spec.kind == "url":
        assert spec.url is not None
        check_loopback(spec.url, allow_remote)
        model_id, is_edge = probe(spec.url, get)
        return Target(spec.label, "url", spec.url, model_id, is_edge)
    if settings is None:
        raise ConfigError("model", f"starting {spec.kind} needs a MODEL (a store name or .gguf path)")
    clock = clock or SystemClock()
    p = port()
    cmd = launch_command(spec.kind, p, settings) + list(spec.args)
    log_path = log_dir / f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', spec.label)}.log"
    try:
        proc = launcher(cmd, log_path)
    except OSError as exc:
        raise TargetStartFailed(spec.label, f"could not run {cmd[0]}: {exc}") from None
    target = Target(spec.label, spec.kind, f"http://127.0.0.1:{p}", command=cmd, process=proc,
                    log_path=log_path)
    deadline = clock.monotonic() + ready_timeout_s
    try:
        while True:
            code = proc.poll()
            if code is not None:
                raise TargetStartFailed(spec.label, f"exited with status {code}", _tail(log_path))
            try:
                if get(target.url + READY_PATHS[spec.kind]).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if clock.monotonic() >= deadline:
                raise TargetStartFailed(spec.label, f"not ready after {ready_timeout_s:g} s", _tail(log_path))
            clock.sleep(0.25)
        try:
            target.model_id, target.is_edge = probe(target.url, get)
        except TargetUnreachable as exc:
            raise TargetStartFailed(spec.label, exc.reason, _tail(log_path)) from None
    except BaseException:
        stop_process(proc, 10.0)
        raise
    return target
