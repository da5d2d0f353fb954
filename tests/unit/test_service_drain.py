"""Graceful drain and the server's signal handling, with a fake clock."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys

import pytest

from edge.api.state import ServerState
from edge.clock import ManualClock
from edge.runtime.types import EngineState, FinishReason, GenerationRequest
from edge.service import server as server_mod
from edge.service.drain import drain
from edge.service.notify import Notifier
from edge.service.server import EdgeServer, make_config
from tests.fakes import CHAT, AsgiCall, ScriptedEngine, make_app, settle


class Recorder(Notifier):
    def __init__(self) -> None:
        super().__init__({})

    def notify(self, *lines: str) -> bool:
        self.sent.append("\n".join(lines))
        return True


def _fake_time(clock: ManualClock, engine: ScriptedEngine | None = None, step_every_s: float = 0.0):
    """An async sleep that advances the fake clock and, optionally, steps the engine."""

    async def sleep(t_s: float) -> None:
        clock.advance(t_s)
        if engine is not None and step_every_s:
            engine.step()
        await asyncio.sleep(0)

    return sleep


def test_drain_lets_running_requests_finish() -> None:
    async def main() -> None:
        clock = ManualClock()
        app, engine = make_app(ScriptedEngine(autostep=False))
        st = app.state.edge
        call = AsgiCall(app, "POST", "/v1/chat/completions", {**CHAT, "max_tokens": 4})
        task = asyncio.create_task(call.run())
        await settle()
        assert len(st.in_flight) == 1
        res = await drain(st, 30.0, clock=clock.monotonic, sleep=_fake_time(clock, engine, 1.0), poll_s=1.0)
        await settle()
        await task
        assert call.status == 200 and res.cancelled == 0 and res.finished == 1 and res.left == 0
        assert 4.0 <= res.waited_s <= 8.0  # 4 steps of 1 s, well under the 30 s timeout
        assert st.server_state is ServerState.STOPPED
        late = AsgiCall(app, "POST", "/v1/chat/completions", CHAT)
        await late.run()
        assert late.status == 503

    asyncio.run(main())


def test_drain_timeout_cancels_the_rest() -> None:
    async def main() -> None:
        clock = ManualClock()
        app, engine = make_app(ScriptedEngine(autostep=False))
        st = app.state.edge
        call = AsgiCall(app, "POST", "/v1/chat/completions", {**CHAT, "stream": True, "max_tokens": 8})
        task = asyncio.create_task(call.run())
        await settle()
        engine.step()
        await settle()
        handle = engine.active[0]
        stepped = {"n": 0}

        async def sleep(t_s: float) -> None:  # the engine is stuck until the drain cancels
            clock.advance(t_s)
            if handle.cancel_requested:
                engine.step()
                stepped["n"] += 1
            await settle()

        res = await drain(st, 10.0, clock=clock.monotonic, sleep=sleep, poll_s=1.0)
        await asyncio.wait_for(task, 1.0)
        assert res.cancelled == 1 and res.left == 0
        assert 10.0 <= res.waited_s <= 12.0
        assert handle.finish_reason is FinishReason.CANCELLED
        assert b"shutting down" in call.body_bytes  # the stream ends with an error event, not [DONE]
        assert b"[DONE]" not in call.body_bytes

    asyncio.run(main())


def test_drain_with_nothing_in_flight_returns_at_once() -> None:
    async def main() -> None:
        clock = ManualClock()
        app, _ = make_app()
        res = await drain(app.state.edge, 30.0, clock=clock.monotonic, sleep=_fake_time(clock))
        assert res.waited_s == 0 and res.cancelled == 0

    asyncio.run(main())


def _server() -> tuple[EdgeServer, ScriptedEngine, Recorder]:
    app, engine = make_app(ScriptedEngine(autostep=False))
    n = Recorder()
    server = EdgeServer(make_config(app, "127.0.0.1", 0), app.state.edge, engine, n, drain_timeout_s=5.0)
    return server, engine, n


def test_first_signal_drains_second_forces_exit() -> None:
    server, engine, _ = _server()
    h = engine.submit(GenerationRequest("a", max_tokens=5))
    server.state.track(h.request_id, h)
    server.handle_exit(signal.SIGTERM, None)
    assert server.drain_requested and not server.should_exit and not server.force_exit
    assert not h.cancel_requested
    server.handle_exit(signal.SIGTERM, None)
    assert server.should_exit and server.force_exit
    assert h.cancel_requested


def test_ready_is_sent_once_after_load_and_drain_sends_stopping() -> None:
    async def main() -> None:
        server, engine, n = _server()
        engine.set_state(EngineState.LOADING)
        server.started = True
        await server.on_tick(1)
        assert not any(m.startswith("READY=1") for m in n.sent)
        engine.set_state(EngineState.READY)
        await server.on_tick(2)
        await server.on_tick(3)
        assert sum(1 for m in n.sent if m.startswith("READY=1")) == 1
        server.handle_exit(signal.SIGTERM, None)
        await server.on_tick(4)
        await settle()
        assert any(m.startswith("STOPPING=1") for m in n.sent)
        assert server.should_exit  # nothing in flight: drained at once
        assert server.state.server_state is ServerState.STOPPED

    asyncio.run(main())


def test_engine_failure_exits_non_zero() -> None:
    async def main() -> None:
        server, engine, n = _server()
        engine.set_state(EngineState.FAILED)
        await server.on_tick(1)
        assert server.should_exit and server.exit_code == 1
        assert any("failed" in m for m in n.sent)

    asyncio.run(main())


def test_the_first_answer_is_warmed_while_the_model_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Startup imports what the first streamed answer needs while the engine still loads (the
    loop is idle then), and leaves it to that answer once the engine is ready."""
    warmed: list[EngineState] = []

    async def main(state: EngineState) -> None:
        server, engine, _ = _server()
        engine.set_state(state)
        monkeypatch.setattr(server_mod, "warm_first_answer", lambda: warmed.append(engine.state))
        server.config.load()  # what uvicorn's Server._serve does before startup (port 0: any free one)
        server.lifespan = server.config.lifespan_class(server.config)
        await server.startup()
        await server.shutdown()

    asyncio.run(main(EngineState.LOADING))
    asyncio.run(main(EngineState.READY))
    assert warmed == [EngineState.LOADING]


def test_warming_loads_anyios_asyncio_backend() -> None:
    code = ("import asyncio, sys\nfrom edge.api.sse import warm_first_answer\n"
            "before = 'anyio._backends._asyncio' in sys.modules\n"
            "async def main():\n    warm_first_answer()\n"
            "asyncio.run(main())\nprint(before, 'anyio._backends._asyncio' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"]
