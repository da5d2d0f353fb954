"""Admission: bounds, priorities, heat and memory refusals, shedding, Retry-After from the real rate."""

from __future__ import annotations

import pytest

from edge.clock import ManualClock
from edge.errors import DevicePaused, EdgeError, InvalidRequest, KvCacheFull, QueueFull, RequestShed
from edge.runtime.types import EngineStats, Knobs, Priority
from edge.scheduler.admission import Admission, TicketState
from edge.scheduler.state import Decision, MemoryMode, ThermalMode
from tests.fakes import engine_stats

INT, BG = Priority.INTERACTIVE, Priority.BACKGROUND


def decision(mode: ThermalMode = ThermalMode.NOMINAL, memory: MemoryMode = MemoryMode.OK,
             cooldown_s: float = 0.0) -> Decision:
    heat = mode in (ThermalMode.GUARD, ThermalMode.PAUSED)
    ok = not heat and memory is MemoryMode.OK
    return Decision(knobs=Knobs(4, 2, paused=heat), mode=mode, memory=memory, admit_interactive=ok,
                    admit_background=ok, shed_background=memory is MemoryMode.SHED, unload=False,
                    reason=f"{mode.value}/{memory.value}", t_s=0.0, cooldown_s=cooldown_s)


def kv_stats(used: int = 0, total: int = 1000, tokens: int = 20, step_s: float = 0.5) -> EngineStats:
    return engine_stats(step_time_s=step_s, decode_time_s=step_s, tokens_decoded=tokens, kv_cells_used=used,
                        kv_cells_total=total, n_slots=4, knobs=Knobs(4, 2))


def test_queue_bound_and_background_share() -> None:
    adm = Admission(max_queue=4, clock=ManualClock())
    bg = [adm.admit(BG, 10, 10) for _ in range(2)]  # background may fill half of the queue
    with pytest.raises(QueueFull) as exc:
        adm.admit(BG, 10, 10)
    assert exc.value.max_queue == 2
    inter = [adm.admit(INT, 10, 10) for _ in range(2)]  # interactive still finds room
    with pytest.raises(QueueFull):
        adm.admit(INT, 10, 10)
    q = adm.queue_state()
    assert (q.waiting_interactive, q.waiting_background) == (2, 2)
    inter[0].start()
    bg[0].start()
    q = adm.queue_state()
    assert (q.running_interactive, q.running_background, q.waiting_interactive) == (1, 1, 1)
    adm.admit(INT, 10, 10)  # a started ticket no longer counts as waiting
    assert adm.rejected == {"QueueFull": 2}


def test_release_is_idempotent_and_records_activity() -> None:
    clock = ManualClock(5.0)
    adm = Admission(max_queue=2, clock=clock)
    t = adm.admit(INT, 1, 1)
    clock.advance(3.0)
    t.release()
    t.release()
    assert t.state is TicketState.DONE
    q = adm.queue_state()
    assert not q.busy and q.last_activity_s == 8.0


def test_retry_after_follows_completion_rate() -> None:
    def retry_with(rate_gap_s: float) -> float:
        clock = ManualClock()
        adm = Admission(max_queue=1, clock=clock)
        for _ in range(10):
            adm.admit(INT, 1, 1).release()
            clock.advance(rate_gap_s)
        adm.admit(INT, 1, 1)
        with pytest.raises(QueueFull) as exc:
            adm.admit(INT, 1, 1)
        return exc.value.retry_after_s

    fast, slow = retry_with(0.5), retry_with(4.0)
    assert fast == pytest.approx(1.0, abs=0.1)  # 2 completions/s, one place: ~0.5 s, clamped to 1 s
    assert slow == pytest.approx(4.0, abs=0.5)  # 0.25/s: one place frees in ~4 s
    assert slow > fast


def test_paused_for_heat_refuses_with_cooldown() -> None:
    adm = Admission(max_queue=8, clock=ManualClock())
    adm.update(decision(ThermalMode.GUARD, cooldown_s=17.0))
    with pytest.raises(DevicePaused) as exc:
        adm.admit(INT, 10, 10)
    assert exc.value.retry_after_s == 17.0 and "guard" in exc.value.reason
    adm.update(decision(ThermalMode.LIMITING))
    adm.admit(INT, 10, 10)


def test_memory_tight_and_shed() -> None:
    adm = Admission(max_queue=8, clock=ManualClock())
    adm.update(decision(memory=MemoryMode.TIGHT))
    for prio in (INT, BG):
        with pytest.raises(DevicePaused):
            adm.admit(prio, 1, 1)
    adm.update(decision(memory=MemoryMode.SHED))
    with pytest.raises(RequestShed):
        adm.admit(BG, 1, 1)
    with pytest.raises(DevicePaused):
        adm.admit(INT, 1, 1)


def test_shedding_cancels_background_with_an_error() -> None:
    adm = Admission(max_queue=8, clock=ManualClock())
    got: list[EdgeError] = []
    bg = adm.admit(BG, 5, 5)
    bg.bind(got.append)
    bg.start()
    inter = adm.admit(INT, 5, 5)
    shed = adm.update(decision(memory=MemoryMode.SHED))
    assert shed == [bg] and bg.state is TicketState.SHED
    assert len(got) == 1 and isinstance(got[0], RequestShed) and got[0].retry_after_s >= 1.0
    assert bg.error is got[0]
    assert inter.state is TicketState.WAITING  # interactive work is never shed
    assert adm.shed_count == 1 and adm.queue_state().running_background == 0


def test_kv_reservations_bound_admission() -> None:
    stats = {"s": kv_stats(used=0, total=1000)}
    adm = Admission(max_queue=8, stats_provider=lambda: stats["s"], clock=ManualClock())
    a = adm.admit(INT, 300, 300)
    with pytest.raises(KvCacheFull) as exc:
        adm.admit(INT, 200, 300)  # 600 reserved + 500 > 1000
    # Retry-After from the engine's token rate: 100 cells short at 40 tokens/s
    assert exc.value.free_cells == 400 and exc.value.retry_after_s == pytest.approx(2.5)
    a.release()
    adm.admit(INT, 200, 300)


def bg_closed(t_s: float = 0.0, retry_s: float = 12.0) -> Decision:
    """LIMITING with interactive work present: the engine starts no new background sequence."""
    return Decision(knobs=Knobs(2, 1, admit_background=False), mode=ThermalMode.LIMITING,
                    memory=MemoryMode.OK, admit_interactive=True, admit_background=False,
                    shed_background=False, unload=False,
                    reason="limiting: interactive first", t_s=t_s, background_retry_s=retry_s)


def test_background_refused_at_once_when_the_engine_would_not_start_it() -> None:
    """Issue: background was admitted while admit_background=False and then waited forever."""
    adm = Admission(max_queue=8, clock=ManualClock())
    adm.update(bg_closed(retry_s=12.0))
    with pytest.raises(DevicePaused) as exc:
        adm.admit(BG, 10, 10)
    assert exc.value.retry_after_s == 12.0 and "background" in exc.value.reason
    assert adm.rejected == {"DevicePaused": 1} and adm.queue_state().waiting_background == 0
    adm.admit(INT, 10, 10)  # interactive still welcome
    adm.update(decision(ThermalMode.NOMINAL))
    adm.admit(BG, 10, 10)  # reopens with the knob


def test_background_queued_before_closing_waits_a_bounded_time_then_errors() -> None:
    clock = ManualClock()
    adm = Admission(max_queue=8, clock=clock, background_max_wait_s=30.0)
    got: list[EdgeError] = []
    waiting, running = adm.admit(BG, 5, 5), adm.admit(BG, 5, 5)
    waiting.bind(got.append)
    running.start()
    adm.update(bg_closed(retry_s=9.0))
    clock.advance(29.0)
    assert adm.update(bg_closed(t_s=29.0)) == [] and waiting.state is TicketState.WAITING
    adm.update(decision(ThermalMode.NOMINAL))  # reopening resets the wait
    adm.update(bg_closed(t_s=29.5))
    clock.advance(29.0)
    assert adm.update(bg_closed(t_s=58.5)) == []
    clock.advance(1.0)
    assert adm.update(bg_closed(t_s=59.5, retry_s=9.0)) == [waiting]
    assert waiting.state is TicketState.SHED and len(got) == 1 and isinstance(got[0], RequestShed)
    assert got[0].retry_after_s == 9.0 and "not started" in got[0].reason
    assert running.state is TicketState.RUNNING  # running background work keeps its KV and finishes


def test_eviction_sheds_every_ticket_with_an_error() -> None:
    adm = Admission(max_queue=8, clock=ManualClock())
    got: list[EdgeError] = []
    tickets = [adm.admit(p, 10, 10) for p in (INT, BG, INT)]
    for t in tickets:
        t.bind(got.append)
    tickets[0].start()
    shed_bg_only = decision(memory=MemoryMode.SHED)
    assert [t.priority for t in adm.update(shed_bg_only)] == [BG]
    evict = Decision(knobs=Knobs(4, 2), mode=ThermalMode.NOMINAL, memory=MemoryMode.SHED,
                     admit_interactive=False, admit_background=False, shed_background=True, unload=True,
                     reason="evict", t_s=0.0, evict=True)
    victims = adm.update(evict)
    assert sorted(t.ticket_id for t in victims) == [tickets[0].ticket_id, tickets[2].ticket_id]
    assert len(got) == 3 and all(isinstance(e, RequestShed) and e.retry_after_s > 0 for e in got)
    assert adm.queue_state().busy is False
    with pytest.raises(DevicePaused):
        adm.admit(INT, 10, 10)


def test_max_queue_counts_only_requests_waiting_beyond_the_free_slots() -> None:
    """`--max-queue N`: N requests may wait beyond the running ones. A request about to take a free
    slot does not wait (the defect: --slots 1 --max-queue 0 refused every request)."""
    adm = Admission(max_queue=0, n_slots=1, clock=ManualClock())
    first = adm.admit(INT, 5, 5)  # idle server, one free slot: served
    with pytest.raises(QueueFull) as exc:
        adm.admit(INT, 5, 5)  # the slot is taken (or about to be) and nothing may wait
    assert exc.value.max_queue == 0 and exc.value.retry_after_s >= 1.0
    first.start()
    first.release()
    adm.admit(INT, 5, 5)  # the slot is free again


@pytest.mark.parametrize(("n_slots", "max_queue", "extra"), [(2, 2, 0), (2, 2, 6), (4, 0, 3), (1, 5, 1)])
def test_a_burst_of_slots_plus_queue_is_served_and_only_the_rest_refused(
        n_slots: int, max_queue: int, extra: int) -> None:
    adm = Admission(max_queue=max_queue, n_slots=n_slots, clock=ManualClock())
    admitted, refused = [], []
    for _ in range(n_slots + max_queue + extra):  # all at once: the engine has started none yet
        try:
            admitted.append(adm.admit(INT, 5, 5))
        except QueueFull as exc:
            refused.append(exc)
    assert len(admitted) == n_slots + max_queue and len(refused) == extra
    assert all(e.retry_after_s >= 1.0 for e in refused)
    for t in admitted[:n_slots]:  # the engine gives slots to the first ones: still full
        t.start()
    with pytest.raises(QueueFull):
        adm.admit(INT, 5, 5)
    admitted[0].release()  # one finishes: exactly one more fits
    adm.admit(INT, 5, 5)
    with pytest.raises(QueueFull):
        adm.admit(INT, 5, 5)


def test_the_prompts_of_one_request_are_admitted_together_or_refused_once() -> None:
    adm = Admission(max_queue=4, n_slots=2, clock=ManualClock())
    five = adm.admit_all(INT, [(5, 5)] * 5)  # 2 run, 3 wait: fits, served
    assert len(five) == 5 and adm.in_flight == 5
    with pytest.raises(QueueFull):
        adm.admit_all(INT, [(5, 5)] * 2)  # only one place left: none of the two is admitted
    assert adm.in_flight == 5
    for t in five:
        t.release()
    with pytest.raises(InvalidRequest) as exc:
        adm.admit_all(INT, [(5, 5)] * 7)  # can never fit: told once, not "retry" forever
    assert "7 prompts" in str(exc.value) and exc.value.param == "prompt"
    bg = adm.admit_all(BG, [(5, 5)] * 3)  # background may use the slots and half the queue
    assert len(bg) == 3
    assert adm.rejected == {"QueueFull": 1, "InvalidRequest": 1}


def test_no_scheduler_means_no_heat_or_memory_checks_only_bounds() -> None:
    """The same class serves `--no-scheduler`: until a decision arrives, only the bound applies."""
    adm = Admission(max_queue=1, n_slots=1, clock=ManualClock(),
                    stats_provider=lambda: kv_stats(used=0, total=1000))
    tickets = [adm.admit(p, 10, 10) for p in (BG, INT)]
    assert [t.state for t in tickets] == [TicketState.WAITING] * 2
    status = adm.status()
    assert status["kind"] == "bounded" and status["in_flight"] == 2 and status["max_running"] == 1
    with pytest.raises(KvCacheFull):  # the KV fit still protects the engine
        Admission(max_queue=8, n_slots=8, stats_provider=lambda: kv_stats(used=900, total=1000)).admit(
            INT, 100, 100)
