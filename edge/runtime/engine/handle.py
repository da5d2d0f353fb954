"""RequestHandle: the hand-off between the engine thread and whoever waits for tokens.

The engine thread calls `_push()`; a consumer reads events either by blocking
iteration (threads, the CLI) or by `async for` (the API). Nothing polls: sync
readers wait on a `threading.Condition`, async readers await a future that the
engine completes with `loop.call_soon_threadsafe`. Leaving an iteration early
(break, client disconnect, task cancellation) cancels the request, so a
vanished client never keeps a sequence decoding.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator

from edge.runtime.types import FinishReason, TokenEvent, Usage


def _wake_future(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _wake_all(futs: list[asyncio.Future[None]]) -> None:
    for fut in futs:
        _wake_future(fut)


class Wakeups:
    """Asyncio wake-ups the engine thread collects during a step and sends in one go.

    Waking an event loop per token made its thread contend with the engine thread for
    the GIL in the middle of a step (and for a core with the decode threads); collected,
    the loop wakes once per step, with every stream's tokens ready, right before the
    engine thread goes back into llama_decode (which releases the GIL).
    """

    def __init__(self) -> None:
        self._by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future[None]]] = {}

    def add(self, loop: asyncio.AbstractEventLoop, fut: asyncio.Future[None]) -> None:
        self._by_loop.setdefault(loop, []).append(fut)

    def flush(self) -> None:
        by_loop, self._by_loop = self._by_loop, {}
        for loop, futs in by_loop.items():
            # a closed consumer loop raises RuntimeError: nobody is listening any more
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_wake_all, futs)


class RequestHandle:
    """A stream of `TokenEvent`s ending with exactly one event that has `finish_reason`."""

    def __init__(self, request_id: str, on_cancel: Callable[[], None] | None = None) -> None:
        self.request_id = request_id
        self._on_cancel = on_cancel
        self._cond = threading.Condition(threading.Lock())
        self._events: deque[TokenEvent] = deque()
        self._finished = False  # the final event was pushed
        self._consumed_final = False
        self._cancel_requested = False  # read by the engine thread without the lock
        self._waiter: tuple[asyncio.AbstractEventLoop, asyncio.Future[None]] | None = None
        self._quiet = False  # wake an asyncio consumer for the first token and the end only
        self._woke_first = False
        self.finish_reason: FinishReason | None = None
        self.usage: Usage | None = None

    # --- engine side -------------------------------------------------------

    def _push(self, event: TokenEvent, wakeups: Wakeups | None = None) -> None:
        """Called by the engine thread; never blocks on the consumer. With `wakeups`, an asyncio
        consumer is woken when they are flushed (end of the step), else at once."""
        with self._cond:
            if self._finished:
                return
            self._events.append(event)
            if event.finish_reason is not None:
                self._finished = True
                self.finish_reason = event.finish_reason
                self.usage = event.usage
            waiter = None
            if not (self._quiet and self._woke_first and event.finish_reason is None):
                waiter, self._waiter = self._waiter, None
                self._woke_first = self._woke_first or (waiter is not None and event.n_tokens > 0)
            self._cond.notify_all()
        if waiter is not None:
            loop, fut = waiter
            if wakeups is not None:
                wakeups.add(loop, fut)
                return
            # a closed consumer loop raises RuntimeError: nobody is listening any more
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_wake_future, fut)

    @property
    def cancel_requested(self) -> bool:
        return self._cancel_requested

    # --- consumer side -----------------------------------------------------

    def quiet(self) -> None:
        """An asyncio consumer that needs the whole answer, not each token (a request that is not
        streamed): woken for the first token (its time is the TTFT) and for the end only. Waking
        an event loop every step for each such request cost the decode threads their cores on a
        2-core box: four unstreamed SmolLM2 requests ran at 0.81x llama-server's aggregate
        over HTTP while the engine alone matched it."""
        self._quiet = True

    def cancel(self) -> None:
        """Ask the engine to stop this request; its sequence and KV are freed at the next step."""
        if self._cancel_requested or self._finished:
            return
        self._cancel_requested = True
        if self._on_cancel is not None:
            self._on_cancel()

    @property
    def done(self) -> bool:
        """True once the final event was produced (it may not be consumed yet)."""
        return self._finished

    def get(self, timeout_s: float | None = None) -> TokenEvent | None:
        """Next event, blocking up to `timeout_s` (None: forever); None on timeout or after the end."""
        with self._cond:
            while not self._events:
                if self._consumed_final:
                    return None
                if not self._cond.wait(timeout_s):
                    return None
            event = self._events.popleft()
            if event.finish_reason is not None:
                self._consumed_final = True
            return event

    def __iter__(self) -> Iterator[TokenEvent]:
        try:
            while True:
                event = self.get()
                if event is None:
                    return
                yield event
                if event.finish_reason is not None:
                    return
        finally:
            if not self._consumed_final:
                self.cancel()

    def __aiter__(self) -> AsyncIterator[TokenEvent]:
        return self._aiter()

    async def _aiter(self) -> AsyncIterator[TokenEvent]:
        loop = asyncio.get_running_loop()
        try:
            while True:
                with self._cond:
                    if self._events:
                        event: TokenEvent | None = self._events.popleft()
                        fut = None
                    elif self._consumed_final:
                        return
                    else:
                        event = None
                        fut = loop.create_future()
                        self._waiter = (loop, fut)
                if fut is not None:
                    await fut
                    continue
                assert event is not None
                if event.finish_reason is not None:
                    self._consumed_final = True
                yield event
                if event.finish_reason is not None:
                    return
        finally:
            if not self._consumed_final:
                self.cancel()

    def text(self) -> str:
        """Block until the end and return the whole output text (raises the request's error)."""
        parts: list[str] = []
        for event in self:
            parts.append(event.text)
            if event.error is not None:
                raise event.error
        return "".join(parts)
