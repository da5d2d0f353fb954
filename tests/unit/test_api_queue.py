"""Bounded queue, priorities, admission errors, and cancel on client disconnect.

These drive the ASGI app directly so the test decides when the engine steps
and when the client vanishes; no real time passes.
"""

from __future__ import annotations

import asyncio

from edge.errors import DevicePaused, QueueFull, RequestShed
from edge.runtime.types import FinishReason, Priority
from edge.scheduler.admission import Admission
from tests.fakes import CHAT, AsgiCall, ScriptedEngine, make_app, settle

COMPLETIONS = "/v1/completions"


def _req(prompt: str = "p", **kw: object) -> dict:
    return {"model": "scripted-model", "prompt": prompt, "max_tokens": 4, **kw}


def test_queue_bound_gives_503_with_retry_after() -> None:
    async def main() -> None:
        app, engine = make_app(ScriptedEngine(n_slots=1, autostep=False), max_queue=1)
        a = AsgiCall(app, "POST", COMPLETIONS, _req())
        b = AsgiCall(app, "POST", COMPLETIONS, _req())
        ta, tb = asyncio.create_task(a.run()), asyncio.create_task(b.run())
        await settle()
        c = AsgiCall(app, "POST", COMPLETIONS, _req())
        await c.run()  # refused at once: 1 running + 1 waiting
        assert c.status == 503
        assert c.header("retry-after") == "1"
        assert b"queue" in c.body_bytes or b"busy" in c.body_bytes
        assert len(engine.submitted) == 2
        while not (ta.done() and tb.done()):
            engine.step()
            await settle()
        assert a.status == b.status == 200
        d = AsgiCall(app, "POST", COMPLETIONS, _req())  # room again
        td = asyncio.create_task(d.run())
        await settle()
        engine.step(5)
        await settle()
        await td
        assert d.status == 200

    asyncio.run(main())


def test_max_queue_zero_allows_only_running_slots() -> None:
    adm = Admission(max_queue=0, n_slots=2)
    t1 = adm.admit(Priority.INTERACTIVE, 1, 1)
    adm.admit(Priority.INTERACTIVE, 1, 1)
    try:
        adm.admit(Priority.INTERACTIVE, 1, 1)
        raise AssertionError("expected QueueFull")
    except QueueFull as exc:
        assert exc.max_queue == 0
    t1.release()
    t1.release()  # idempotent
    assert adm.in_flight == 1
    adm.admit(Priority.INTERACTIVE, 1, 1)


def test_priority_header_orders_interactive_first() -> None:
    async def main() -> None:
        app, engine = make_app(ScriptedEngine(n_slots=1, autostep=False))
        bg1 = AsgiCall(app, "POST", COMPLETIONS, _req("bg1"), {"X-Edge-Priority": "background"})
        bg2 = AsgiCall(app, "POST", COMPLETIONS, _req("bg2"), {"X-Edge-Priority": "background"})
        inter = AsgiCall(app, "POST", COMPLETIONS, _req("inter"))
        tasks = [asyncio.create_task(c.run()) for c in (bg1, bg2, inter)]
        await settle()
        assert [r.priority for r in engine.submitted] == [
            Priority.BACKGROUND,
            Priority.BACKGROUND,
            Priority.INTERACTIVE,
        ]
        order: list[str] = []
        while not all(t.done() for t in tasks):
            engine.step()
            await settle()
            for name, _c, t in (("bg1", bg1, tasks[0]), ("bg2", bg2, tasks[1]), ("inter", inter, tasks[2])):
                if t.done() and name not in order:
                    order.append(name)
        assert order == ["inter", "bg1", "bg2"]

    asyncio.run(main())


def test_bad_priority_header_is_400() -> None:
    async def main() -> None:
        app, engine = make_app()
        c = AsgiCall(app, "POST", COMPLETIONS, _req(), {"X-Edge-Priority": "urgent"})
        await c.run()
        assert c.status == 400 and engine.submitted == []

    asyncio.run(main())


def test_stream_disconnect_cancels_and_frees_slot() -> None:
    async def main() -> None:
        app, engine = make_app(ScriptedEngine(n_slots=1, autostep=False))
        call = AsgiCall(app, "POST", "/v1/chat/completions", {**CHAT, "stream": True, "max_tokens": 8})
        task = asyncio.create_task(call.run())
        await settle()
        engine.step(2)
        await settle()
        assert b"tok1" in call.body_bytes
        handle = engine.active[0]
        call.disconnect()
        await settle()
        await asyncio.wait_for(task, 1.0)
        assert handle.cancel_requested
        assert app.state.edge.in_flight == {}
        engine.step()  # the next engine step frees the sequence
        assert engine.active == [] and handle.finish_reason is FinishReason.CANCELLED
        assert handle.emitted == 2

    asyncio.run(main())


def test_stream_disconnect_while_waiting_for_a_slot() -> None:
    async def main() -> None:
        app, engine = make_app(ScriptedEngine(n_slots=1, autostep=False))
        busy = AsgiCall(app, "POST", COMPLETIONS, _req(max_tokens=3))
        waiting = AsgiCall(app, "POST", COMPLETIONS, _req(stream=True))
        tb, tw = asyncio.create_task(busy.run()), asyncio.create_task(waiting.run())
        await settle()
        engine.step()
        await settle()
        assert len(engine.waiting) == 1
        waiting.disconnect()
        await settle()
        await asyncio.wait_for(tw, 1.0)
        engine.step()
        assert engine.waiting == []  # removed without ever taking the slot
        engine.step(3)
        await settle()
        await tb
        assert busy.status == 200

    asyncio.run(main())


def test_non_streaming_disconnect_cancels() -> None:
    async def main() -> None:
        app, engine = make_app(ScriptedEngine(n_slots=1, autostep=False))
        call = AsgiCall(app, "POST", "/v1/chat/completions", {**CHAT, "max_tokens": 8})
        task = asyncio.create_task(call.run())
        await settle()
        engine.step()
        await settle()
        handle = engine.active[0]
        call.disconnect()
        await settle()
        await asyncio.wait_for(task, 1.0)
        assert handle.cancel_requested
        engine.step()
        assert engine.active == []
        assert app.state.edge.admission.in_flight == 0

    asyncio.run(main())


class RefusingAdmission:
    def __init__(self, err: Exception) -> None:
        self.err = err

    def admit_all(self, priority: Priority, needs: list[tuple[int, int]]) -> list[object]:
        raise self.err

    def status(self) -> dict[str, object]:
        return {"kind": "refusing"}


def test_device_paused_and_shed_are_503_with_retry_after() -> None:
    async def main() -> None:
        for err, retry in (
            (DevicePaused("GPU at 97 °C", retry_after_s=7.2), "8"),
            (RequestShed("memory pressure", retry_after_s=30), "30"),
        ):
            app, engine = make_app(admission=RefusingAdmission(err))
            c = AsgiCall(app, "POST", "/v1/chat/completions", CHAT)
            await c.run()
            assert c.status == 503
            assert c.header("retry-after") == retry
            assert engine.submitted == []

    asyncio.run(main())


class ShedTicket:
    def __init__(self) -> None:
        self.on_shed = None
        self.started = self.released = False

    def bind(self, cb) -> None:
        self.on_shed = cb

    def start(self) -> None:
        self.started = True

    def release(self) -> None:
        self.released = True


class TicketAdmission:
    def __init__(self) -> None:
        self.tickets: list[ShedTicket] = []

    def admit_all(self, priority: Priority, needs: list[tuple[int, int]]) -> list[ShedTicket]:
        new = [ShedTicket() for _ in needs]
        self.tickets.extend(new)
        return new

    def status(self) -> dict[str, object]:
        return {"kind": "fake", "in_flight": len(self.tickets)}


def test_scheduler_shedding_a_running_request_reports_503() -> None:
    async def main() -> None:
        adm = TicketAdmission()
        app, engine = make_app(ScriptedEngine(autostep=False), admission=adm)
        c = AsgiCall(app, "POST", COMPLETIONS, _req(max_tokens=8), {"X-Edge-Priority": "background"})
        task = asyncio.create_task(c.run())
        await settle()
        engine.step()
        await settle()
        ticket = adm.tickets[0]
        assert ticket.started  # first token: it holds a slot
        ticket.on_shed(RequestShed("memory pressure"))
        engine.step()
        await settle()
        await asyncio.wait_for(task, 1.0)
        assert c.status == 503 and b"request_shed" in c.body_bytes
        assert ticket.released

    asyncio.run(main())


def test_client_gone_before_the_stream_starts_releases_everything() -> None:
    async def main() -> None:
        app, engine = make_app(ScriptedEngine(n_slots=1, autostep=False))
        call = AsgiCall(app, "POST", COMPLETIONS, _req(stream=True), yield_on_send=True)
        call.disconnect()  # the body arrives, then the client is gone at once
        await asyncio.wait_for(call.run(), 1.0)
        st = app.state.edge
        assert st.in_flight == {}
        assert st.admission.in_flight == 0
        assert engine.waiting[0].cancel_requested
        engine.step()
        assert engine.waiting == [] and engine.active == []

    asyncio.run(main())


def test_max_queue_zero_serves_one_request_per_free_slot() -> None:
    """The defect: `--slots 1 --max-queue 0` answered every request with 503, even when idle."""
    async def main() -> None:
        app, engine = make_app(ScriptedEngine(n_slots=1, autostep=False), max_queue=0)
        a = AsgiCall(app, "POST", COMPLETIONS, _req())
        ta = asyncio.create_task(a.run())
        await settle()
        b = AsgiCall(app, "POST", COMPLETIONS, _req())
        await b.run()  # the one slot is taken and nothing may wait
        assert b.status == 503 and b.header("retry-after") is not None
        while not ta.done():
            engine.step()
            await settle()
        assert a.status == 200

    asyncio.run(main())


def test_burst_of_slots_plus_queue_is_all_served_and_the_rest_refused() -> None:
    async def main() -> None:
        app, engine = make_app(ScriptedEngine(n_slots=2, autostep=False), max_queue=2)
        calls = [AsgiCall(app, "POST", COMPLETIONS, _req()) for _ in range(7)]
        tasks = [asyncio.create_task(c.run()) for c in calls]  # all arrive before any step
        await settle()
        while not all(t.done() for t in tasks):
            engine.step()
            await settle()
        statuses = sorted(c.status for c in calls)
        assert statuses == [200] * 4 + [503] * 3
        assert all(c.header("retry-after") for c in calls if c.status == 503)

    asyncio.run(main())


def test_a_multi_prompt_completion_that_can_never_fit_is_a_400_once() -> None:
    async def main() -> None:
        app, engine = make_app(ScriptedEngine(n_slots=2, autostep=False), max_queue=4)
        five = AsgiCall(app, "POST", COMPLETIONS, {**_req(), "prompt": ["a", "b", "c", "d", "e"]})
        task = asyncio.create_task(five.run())  # idle server: 2 run, 3 wait
        await settle()
        while not task.done():
            engine.step()
            await settle()
        assert five.status == 200
        seven = AsgiCall(app, "POST", COMPLETIONS, {**_req(), "prompt": list("abcdefg")})
        await seven.run()
        assert seven.status == 400 and b"7 prompts" in seven.body_bytes
        bg = AsgiCall(app, "POST", COMPLETIONS, {**_req(), "prompt": ["a", "b", "c"]},
                      {"X-Edge-Priority": "background"})
        task = asyncio.create_task(bg.run())  # was refused on an idle server
        await settle()
        while not task.done():
            engine.step()
            await settle()
        assert bg.status == 200

    asyncio.run(main())
