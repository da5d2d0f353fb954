"""A tiny fake OpenAI-compatible streaming server for load-test tests (plain asyncio sockets).

`plan(n)` decides how the n-th completion request (1-based, in arrival order) is answered:
HTTP status, delay before the first token, gap between tokens, token count, whether the
final usage chunk is sent, or a hang (read the request, never answer). It also answers
/v1/models, /ready and, like edge, /v1/status with a rising temperature.

Run as a script (`python fake_openai.py --port P`) it serves normal requests until SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any


@dataclass(frozen=True)
class Behaviour:
    status: int = 200
    ttft_s: float = 0.02
    gap_s: float = 0.02
    n_tokens: int = 4
    usage: bool = True
    hang: bool = False


Plan = Callable[[int], Behaviour]


@dataclass
class Arrival:
    n: int
    t_s: float
    path: str
    body: dict[str, Any] = field(default_factory=dict)


class FakeOpenAI:
    """Serves on 127.0.0.1 (a port the OS picks) from a background thread; `stop()` ends it."""

    def __init__(self, plan: Plan = lambda n: Behaviour(), *, edge_status: bool = True,
                 port: int = 0) -> None:
        self.plan, self.edge_status, self.port = plan, edge_status, port
        self.arrivals: list[Arrival] = []
        self.status_polls = 0
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fake-openai", daemon=True)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._t0 = time.monotonic()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeOpenAI:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("fake server did not start")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stopping is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join(10)

    def __enter__(self) -> FakeOpenAI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- server ---------------------------------------------------------------------

    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._loop.run_until_complete(self._main())
        self._loop.close()

    async def _main(self) -> None:
        self._stopping = asyncio.Event()
        server = await asyncio.start_server(self._track, "127.0.0.1", self.port)
        self.port = int(server.sockets[0].getsockname()[1])
        self._ready.set()
        await self._stopping.wait()
        server.close()
        await server.wait_closed()
        if self._tasks:  # hanging handlers end on _stopping; give the rest a moment, then cancel
            _, pending = await asyncio.wait(self._tasks, timeout=2.0)
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    async def _track(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)  # type: ignore[arg-type]
        try:
            await self._connection(reader, writer)
        finally:
            self._tasks.discard(task)  # type: ignore[arg-type]

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                line = await reader.readline()
                if not line:
                    return
                method, path, _ = line.decode().split(" ", 2)
                headers: dict[str, str] = {}
                while (h := await reader.readline()) not in (b"\r\n", b"\n", b""):
                    k, _, v = h.decode().partition(":")
                    headers[k.strip().lower()] = v.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                if not await self._route(method, path, body, writer):
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    @staticmethod
    async def _json(writer: asyncio.StreamWriter, status: int, obj: Any) -> bool:
        data = json.dumps(obj).encode()
        head = (f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(data)}\r\n\r\n")
        writer.write(head.encode() + data)
        await writer.drain()
        return True

    async def _route(self, method: str, path: str, body: bytes, writer: asyncio.StreamWriter) -> bool:
        if method == "GET" and path == "/v1/models":
            return await self._json(writer, 200, {"object": "list", "data": [{"id": "fake-model"}]})
        if method == "GET" and path == "/ready":
            return await self._json(writer, 200, {"status": "ready"})
        if method == "GET" and path == "/v1/status":
            if not self.edge_status:
                return await self._json(writer, 404, {"error": {"message": "not found"}})
            self.status_polls += 1
            t = time.monotonic() - self._t0
            return await self._json(writer, 200, {
                "scheduler": {
                    "temp_c": 45.0 + 2.0 * t,
                    "decision": {"mode": "nominal", "budget": max(0.2, 1.0 - 0.1 * t), "reason": ""},
                },
                "knobs": {"active_limit": 4, "n_threads": 2, "duty": 1.0, "off_threads": 0,
                          "paused": False},
                "slots": {"active": 1, "waiting": 0},
            })
        if method == "POST" and path in ("/v1/chat/completions", "/v1/completions"):
            n = len(self.arrivals) + 1
            self.arrivals.append(Arrival(n, time.monotonic() - self._t0, path, json.loads(body)))
            return await self._complete(self.plan(n), path, writer)
        return await self._json(writer, 404, {"error": {"message": f"no route {method} {path}"}})

    async def _complete(self, b: Behaviour, path: str, writer: asyncio.StreamWriter) -> bool:
        if b.hang:
            assert self._stopping is not None
            await self._stopping.wait()
            return False
        if b.status != 200:
            return await self._json(writer, b.status, {"error": {"message": f"injected {b.status}"}})
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")

        async def event(obj: Any) -> None:
            data = f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n".encode()
            writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            await writer.drain()

        chat = path.endswith("chat/completions")

        def choice(text: str | None, finish: str | None = None) -> dict[str, Any]:
            if chat:
                delta = {} if text is None else {"content": text}
                return {"index": 0, "delta": delta, "finish_reason": finish}
            return {"index": 0, "text": text or "", "finish_reason": finish}

        await event({"choices": [choice("" if chat else None)]})
        for k in range(b.n_tokens):
            await asyncio.sleep(b.ttft_s if k == 0 else b.gap_s)
            await event({"choices": [choice(f"w{k} ")]})
        await event({"choices": [choice(None, "length")]})
        if b.usage:
            await event({"choices": [], "usage": {"prompt_tokens": 8, "completion_tokens": b.n_tokens,
                                                  "total_tokens": 8 + b.n_tokens}})
        await event("[DONE]")
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    fake = FakeOpenAI(port=ap.parse_args().port).start()
    with contextlib.suppress(KeyboardInterrupt):
        threading.Event().wait()
