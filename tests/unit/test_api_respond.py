"""`stream_or_json`, the one stream-or-JSON answer both APIs use: a client that leaves an
unstreamed request gets 499 on /v1 and /api alike, and the generation is released once."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from edge.api.respond import CLIENT_CLOSED, stream_or_json
from tests.fakes import AsgiCall, ScriptedEngine, make_app, settle

M = "scripted-model"
MSG = [{"role": "user", "content": "hello there"}]


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/chat/completions", {"model": M, "messages": MSG, "max_tokens": 8}),
    ("/v1/completions", {"model": M, "prompt": "hi", "max_tokens": 8}),
    ("/api/chat", {"model": M, "messages": MSG, "stream": False, "options": {"num_predict": 8}}),
    ("/api/generate", {"model": M, "prompt": "hi", "stream": False, "options": {"num_predict": 8}}),
])
def test_an_unstreamed_request_whose_client_left_gets_499_on_both_apis(path: str, body: dict) -> None:
    async def main() -> None:
        app, engine = make_app(ScriptedEngine(n_slots=1, autostep=False))
        call = AsgiCall(app, "POST", path, body)
        task = asyncio.create_task(call.run())
        await settle()
        engine.step()
        await settle()
        handle = engine.active[0]
        call.disconnect()
        await settle()
        await asyncio.wait_for(task, 1.0)
        assert call.status == CLIENT_CLOSED and handle.cancel_requested
        assert app.state.edge.admission.in_flight == 0

    asyncio.run(main())


class _Gen:
    """The part of a `Generation` the helper touches."""

    def __init__(self, stream: bool) -> None:
        self.stream = stream
        self.exits = 0

    async def __aexit__(self, *exc: object) -> None:
        self.exits += 1


def test_close_releases_once_then_runs_after_once() -> None:
    async def main() -> None:
        gen = _Gen(stream=True)
        afters: list[int] = []
        closers: list[Any] = []

        async def after() -> None:
            afters.append(1)

        def stream(close: Any) -> Any:
            closers.append(close)
            return SimpleNamespace()

        await stream_or_json(SimpleNamespace(), gen, stream, lambda g: {}, after)  # type: ignore[arg-type]
        assert gen.exits == 0 and afters == []  # a stream closes when it ends, not before
        await closers[0]()
        await closers[0]()  # the body's end and the response's close both call it
        assert gen.exits == 1 and afters == [1]

    asyncio.run(main())
