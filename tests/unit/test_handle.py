"""RequestHandle hands events from the engine thread to sync and async readers without polling."""

from __future__ import annotations

import asyncio
import contextlib
import threading

from edge.runtime.engine.handle import RequestHandle
from edge.runtime.types import FinishReason, TokenEvent, Usage


def _final(text: str = "") -> TokenEvent:
    return TokenEvent(text, 1, FinishReason.STOP, Usage(3, 2))


def test_sync_iteration_blocks_until_producer_pushes() -> None:
    h = RequestHandle("r1")
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.extend(ev.text for ev in h))
    reader.start()
    h._push(TokenEvent("a", 1))
    h._push(_final("b"))
    reader.join(timeout=5)
    assert not reader.is_alive()
    assert got == ["a", "b"]
    assert h.done and h.finish_reason is FinishReason.STOP and h.usage == Usage(3, 2)


def test_events_after_final_are_dropped() -> None:
    h = RequestHandle("r")
    h._push(_final())
    h._push(TokenEvent("late", 1))
    assert [e.text for e in h] == [""]


def test_get_times_out_without_events() -> None:
    h = RequestHandle("r")
    assert h.get(timeout_s=0.0) is None


def test_async_iteration_is_woken_from_another_thread() -> None:
    h = RequestHandle("r2")

    async def main() -> list[str]:
        loop = asyncio.get_running_loop()

        def produce() -> None:
            h._push(TokenEvent("x", 1))
            h._push(_final("y"))

        loop.call_soon(lambda: threading.Thread(target=produce).start())
        return [ev.text async for ev in h]

    assert asyncio.run(main()) == ["x", "y"]


def test_breaking_out_of_iteration_cancels_once() -> None:
    calls: list[int] = []
    h = RequestHandle("r3", on_cancel=lambda: calls.append(1))
    h._push(TokenEvent("a", 1))
    for _ev in h:
        break
    assert h.cancel_requested and calls == [1]
    h.cancel()
    assert calls == [1]


def test_async_task_cancellation_cancels_request() -> None:
    calls: list[int] = []
    h = RequestHandle("r4", on_cancel=lambda: calls.append(1))

    async def main() -> None:
        async def consume() -> None:
            async for _ in h:
                pass

        task = asyncio.create_task(consume())
        await asyncio.sleep(0)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert calls == [1] and h.cancel_requested


def test_cancel_after_finish_is_a_no_op() -> None:
    calls: list[int] = []
    h = RequestHandle("r5", on_cancel=lambda: calls.append(1))
    h._push(_final("done"))
    assert h.text() == "done"
    h.cancel()
    assert calls == []


def test_a_quiet_consumer_is_woken_for_the_first_token_and_the_end_only() -> None:
    async def main() -> list[str]:
        h = RequestHandle("r")
        h.quiet()
        got: list[str] = []

        async def consume() -> None:
            async for ev in h:
                got.append(ev.text)

        task = asyncio.create_task(consume())
        for _ in range(3):
            await asyncio.sleep(0)  # the consumer waits
        h._push(TokenEvent("a", 1))  # the first token wakes it: its time is the TTFT
        for _ in range(3):
            await asyncio.sleep(0)
        assert got == ["a"]
        h._push(TokenEvent("b", 1))
        h._push(TokenEvent("c", 1))
        for _ in range(3):
            await asyncio.sleep(0)
        assert got == ["a"]  # no wake-up per token
        h._push(TokenEvent("", 0, finish_reason=FinishReason.STOP))
        await asyncio.wait_for(task, 5)
        return got

    assert asyncio.run(main()) == ["a", "b", "c", ""]
