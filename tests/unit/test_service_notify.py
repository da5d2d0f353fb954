"""sd_notify over a real unix datagram socket, and the engine-liveness watchdog."""

from __future__ import annotations

import asyncio
import os
import socket
from dataclasses import replace
from pathlib import Path

import pytest

from edge.clock import ManualClock
from edge.runtime.types import EngineState, GenerationRequest, Knobs
from edge.service.notify import Notifier, engine_healthy, watchdog_loop
from tests.fakes import ScriptedEngine


def _listener(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(2.0)
    return sock


def test_notify_to_path_socket(tmp_path: Path) -> None:
    path = str(tmp_path / "notify.sock")
    with _listener(path) as sock:
        n = Notifier({"NOTIFY_SOCKET": path})
        assert n.enabled and n.ready("serving m")
        msg = sock.recv(4096).decode()
        assert msg.splitlines()[:2] == ["READY=1", "STATUS=serving m"]
        assert f"MAINPID={os.getpid()}" in msg
        n.stopping()
        assert sock.recv(4096).decode().startswith("STOPPING=1")
        n.watchdog()
        assert sock.recv(4096) == b"WATCHDOG=1"


@pytest.mark.skipif(os.uname().sysname != "Linux", reason="abstract sockets are Linux-only")
def test_notify_to_abstract_socket() -> None:
    name = f"edge-test-{os.getpid()}"
    with _listener("\0" + name) as sock:
        n = Notifier({"NOTIFY_SOCKET": "@" + name})
        assert n.watchdog()
        assert sock.recv(4096) == b"WATCHDOG=1"


def test_notify_without_socket_is_a_no_op(tmp_path: Path) -> None:
    assert not Notifier({}).ready()
    assert not Notifier({"NOTIFY_SOCKET": "relative"}).enabled
    n = Notifier({"NOTIFY_SOCKET": str(tmp_path / "gone.sock")})
    assert n.enabled and not n.ready()  # failure is logged, never raised


def test_watchdog_interval_is_half_of_watchdog_usec() -> None:
    assert Notifier({"WATCHDOG_USEC": "10000000"}).watchdog_s == 5.0
    assert Notifier({"WATCHDOG_USEC": "10000000", "WATCHDOG_PID": "1"}).watchdog_s is None
    assert Notifier({"WATCHDOG_USEC": "10000000", "WATCHDOG_PID": str(os.getpid())}).watchdog_s == 5.0
    assert Notifier({}).watchdog_s is None


def test_engine_health_rules() -> None:
    e = ScriptedEngine(autostep=False)
    e.start()
    idle = e.stats()
    assert engine_healthy(idle, now_s=1000.0, stall_s=10)[0]  # idle is healthy however long
    busy = replace(idle, active=1, last_progress_s=100.0)
    assert engine_healthy(busy, now_s=105.0, stall_s=10) == (True, "progressing")
    ok, why = engine_healthy(busy, now_s=111.0, stall_s=10)
    assert not ok and "no engine step for 11.0 s" in why
    paused = replace(busy, knobs=Knobs(active_limit=0, n_threads=1, paused=True))
    assert engine_healthy(paused, now_s=1000.0, stall_s=10)[0]
    assert not engine_healthy(replace(idle, state=EngineState.FAILED), 0.0, 10)[0]
    assert engine_healthy(replace(idle, state=EngineState.LOADING), 0.0, 10)[0]
    assert not engine_healthy(replace(idle, state=EngineState.STOPPED), 0.0, 10)[0]
    # keep-alive: unloaded, or reloading with requests waiting, is not a hung engine
    assert engine_healthy(replace(busy, state=EngineState.UNLOADED), 1000.0, 10)[0]
    assert engine_healthy(replace(busy, state=EngineState.LOADING), 1000.0, 10)[0]


class Recorder(Notifier):
    def __init__(self, watchdog_s: float) -> None:
        super().__init__({})
        self.watchdog_s = watchdog_s

    def notify(self, *lines: str) -> bool:
        self.sent.append("\n".join(lines))
        return True


def test_watchdog_loop_stops_pinging_when_the_engine_hangs() -> None:
    clock = ManualClock(100.0)
    engine = ScriptedEngine(autostep=False, clock=clock)
    engine.start()
    n = Recorder(watchdog_s=5.0)

    async def fake_sleep(t_s: float) -> None:
        clock.advance(t_s)

    async def main() -> None:
        engine.submit(GenerationRequest("a b"))  # busy, and no step ever comes
        beats = await watchdog_loop(n, engine, clock.monotonic, stall_s=12.0, sleep=fake_sleep, max_beats=6)
        # progress at t=100; checks at 100, 105, 110 are healthy, 115.. are not
        assert beats == 3
        assert n.sent.count("WATCHDOG=1") == 3
        assert sum(1 for m in n.sent if m.startswith("STATUS=unhealthy")) == 1

    asyncio.run(main())


def test_watchdog_loop_is_off_without_watchdog_usec() -> None:
    engine = ScriptedEngine()
    engine.start()
    assert asyncio.run(watchdog_loop(Notifier({}), engine, lambda: 0.0, 10.0, max_beats=3)) == 0


def test_notify_never_blocks_when_the_receiver_stops_reading(tmp_path: Path) -> None:
    path = str(tmp_path / "full.sock")
    with _listener(path):
        n = Notifier({"NOTIFY_SOCKET": path})
        results = [n.watchdog() for _ in range(2000)]  # far beyond the datagram queue length
        assert results[0] is True
        assert results[-1] is False  # dropped, not blocked (a blocking send would hang this test)
