"""Admission: a bounded, priority-aware account of requests, checked before the engine sees them.

One class serves every configuration: without a scheduler nobody calls `update()`,
so the heat and memory checks are off and only the bounds apply.

The API calls `admit()` before `engine.submit()` and `Ticket.release()` when the
request ends, however it ends. Admission enforces, in order: heat (DevicePaused),
memory state (DevicePaused / RequestShed for background), the queue bound
(QueueFull; background work may only fill part of the queue so interactive
requests always find room), and the KV/memory fit (KvCacheFull,
InsufficientMemory). Every refusal carries a Retry-After derived from the
current completion rate or the controller's cooldown estimate, never a constant.

The queue bound: `max_queue` requests may wait beyond the running ones. A request
that will take a free slot does not wait, so with `n_slots` slots at most
`n_slots + max_queue` requests are in flight, and `max_queue=0` still serves one
request per free slot. A request with more prompts than that can never fit: it is
refused once with InvalidRequest (400), never told to retry.

Tickets move WAITING -> RUNNING -> DONE (or SHED): the engine calls `Ticket.start()`
when the request's sequence gets a slot (`engine.submit(..., on_start=ticket.start)`),
in production and in `edge sim` alike; shedding ends background tickets with a
RequestShed error handed to the callback the API bound, so nothing is lost silently.

Background work follows the engine knob exactly: while the decision says
`admit_background=False` the engine starts no new background sequence, so a new
background request is refused at once with DevicePaused and a Retry-After (a
batch client retries), never queued to wait for a knob that may stay off for
minutes. Background requests admitted just before admission closed wait at most
`background_max_wait_s` of closure; then they are shed with RequestShed.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Callable, Sequence
from enum import Enum
from typing import Any, Protocol

from edge.clock import Clock, SystemClock
from edge.contracts.engine import EngineStats, Priority
from edge.errors import DevicePaused, EdgeError, InvalidRequest, QueueFull, RequestShed
from edge.scheduler.headroom import LoadState
from edge.scheduler.memory import check_fits, free_kv_cells
from edge.scheduler.state import Decision, MemoryMode, QueueState

RATE_WINDOW_S = 60.0
MIN_RETRY_S, MAX_RETRY_S = 1.0, 120.0


class TicketLike(Protocol):
    """One admitted request's claim, as the API holds it."""

    def bind(self, on_shed: Callable[[EdgeError], None]) -> None: ...

    def start(self) -> None: ...

    def release(self) -> None: ...


class AdmissionLike(Protocol):
    """What the API needs from admission (tests substitute fakes)."""

    def admit_all(self, priority: Priority, needs: Sequence[tuple[int, int]]) -> Sequence[TicketLike]: ...

    def status(self) -> dict[str, Any]: ...

    def load(self) -> LoadState: ...


class TicketState(str, Enum):
    WAITING = "waiting"
    RUNNING = "running"
    DONE = "done"
    SHED = "shed"


class Ticket:
    """One admitted request's claim on the queue and on KV cells."""

    def __init__(self, owner: Admission, ticket_id: int, priority: Priority, need_cells: int) -> None:
        self._owner = owner
        self.ticket_id = ticket_id
        self.priority = priority
        self.need_cells = need_cells
        self.admitted_s = owner.clock.monotonic()
        self.state = TicketState.WAITING
        self.error: EdgeError | None = None
        self._on_shed: Callable[[EdgeError], None] | None = None

    def bind(self, on_shed: Callable[[EdgeError], None]) -> None:
        """Called with the RequestShed error if this ticket is shed (the API cancels and reports it)."""
        self._on_shed = on_shed

    def start(self) -> None:
        self._owner._start(self)

    def release(self) -> None:
        """The request finished (any way). Idempotent."""
        self._owner._release(self)

    def _shed(self, err: EdgeError) -> None:
        self.error = err
        if self._on_shed is not None:
            self._on_shed(err)


class Admission:
    """Thread-safe admission control; `update()` feeds it each scheduler decision."""

    def __init__(
        self,
        max_queue: int,
        stats_provider: Callable[[], EngineStats | None] | None = None,
        *,
        n_slots: int = 0,
        scheduled: bool = False,
        clock: Clock | None = None,
        reserve_bytes: int = 0,
        kv_bytes_per_cell: int = 0,
        background_share: float = 0.5,
        background_max_wait_s: float = 60.0,
        wall_s_per_decision_s: float = 1.0,
    ) -> None:
        self.max_queue = max_queue
        self.n_slots = n_slots  # requests that run without waiting (0: every request counts as waiting)
        self.scheduled = scheduled  # a scheduler feeds it decisions (shown as the queue's kind)
        self.stats_provider = stats_provider or (lambda: None)
        self.clock = clock or SystemClock()
        self.reserve_bytes = reserve_bytes
        self.kv_bytes_per_cell = kv_bytes_per_cell
        self.background_share = background_share
        self.background_max_wait_s = background_max_wait_s
        self._bg_closed_since_s: float | None = None
        # decisions' durations are in scheduler-clock seconds (device seconds under sim:PROFILE@SCALE)
        self.wall_s_per_decision_s = wall_s_per_decision_s
        self.decision: Decision | None = None
        self.mem_available_bytes: int | None = None
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._tickets: dict[int, Ticket] = {}
        self._finished_s: deque[float] = deque()
        self._last_activity_s: float | None = None
        self.rejected: dict[str, int] = {}
        self.shed_count = 0

    # --- feed from the scheduler ------------------------------------------
    def update(self, decision: Decision, mem_available_bytes: int | None = None) -> list[Ticket]:
        """Take the latest decision; shed background tickets (all, on eviction) if it says so.

        Returns the shed tickets."""
        with self._lock:
            self.decision = decision
            self.mem_available_bytes = mem_available_bytes
            now = self.clock.monotonic()
            victims: list[Ticket] = []
            retry = self._memory_retry_s()
            err_reason = decision.reason
            if decision.admit_background:
                self._bg_closed_since_s = None
            elif self._bg_closed_since_s is None:
                self._bg_closed_since_s = now
            if decision.evict:  # memory emergency: the model is being unloaded, nothing can run
                victims = list(self._tickets.values())
            elif decision.shed_background:
                victims = [t for t in self._tickets.values() if t.priority is Priority.BACKGROUND]
            elif self._bg_closed_since_s is not None:
                # admitted before admission closed, still not started: bounded wait, then a clear error
                closed_s = now - self._bg_closed_since_s
                victims = [t for t in self._tickets.values()
                           if t.priority is Priority.BACKGROUND and t.state is TicketState.WAITING
                           and min(closed_s, now - t.admitted_s) >= self.background_max_wait_s]
                if victims:
                    err_reason = (f"background admission closed for {closed_s:.0f} s and this request "
                                  f"has not started: {decision.reason}")
                    retry = _clamp(decision.background_retry_s * self.wall_s_per_decision_s)
            for t in victims:
                t.state = TicketState.SHED
                del self._tickets[t.ticket_id]
            self.shed_count += len(victims)
            if victims:
                self._last_activity_s = now
        for t in victims:
            t._shed(RequestShed(reason=err_reason, retry_after_s=retry))
        return victims

    # --- the API's side ---------------------------------------------------
    def admit(self, priority: Priority, prompt_tokens: int, max_tokens: int) -> Ticket:
        """Admit one request or raise a typed, retryable error."""
        return self.admit_all(priority, [(prompt_tokens, max_tokens)])[0]

    def admit_all(self, priority: Priority, needs: Sequence[tuple[int, int]]) -> list[Ticket]:
        """Admit the prompts of one request together (prompt tokens, max tokens each), or none."""
        stats = self.stats_provider()
        with self._lock:
            try:
                self._check_state(priority)
                self._check_bound(priority, len(needs), stats)
                tickets: list[Ticket] = []
                try:
                    for prompt_tokens, max_tokens in needs:
                        tickets.append(self._admit_locked(priority, prompt_tokens, max_tokens, stats))
                except BaseException:
                    for t in tickets:
                        del self._tickets[t.ticket_id]
                    raise
                return tickets
            except EdgeError as exc:
                key = type(exc).__name__
                self.rejected[key] = self.rejected.get(key, 0) + 1
                raise

    @property
    def in_flight(self) -> int:
        return len(self._tickets)

    def _check_state(self, priority: Priority) -> None:
        """Heat and memory refusals (off until the scheduler has sent a decision)."""
        d = self.decision
        wall = self.wall_s_per_decision_s
        if d is not None:
            if not d.admit_interactive and d.memory is MemoryMode.OK:
                raise DevicePaused(reason=d.reason, retry_after_s=_clamp(d.cooldown_s * wall))
            if d.memory is not MemoryMode.OK:
                if priority is Priority.BACKGROUND and d.memory is MemoryMode.SHED:
                    raise RequestShed(reason=d.reason, retry_after_s=self._memory_retry_s())
                raise DevicePaused(reason=d.reason, retry_after_s=self._memory_retry_s())
            if priority is Priority.BACKGROUND and not d.admit_background:
                raise DevicePaused(reason=f"background work is not admitted now ({d.reason})",
                                   retry_after_s=_clamp(d.background_retry_s * wall))

    def _check_bound(self, priority: Priority, n: int, stats: EngineStats | None) -> None:
        """`n` more requests may come in when those that must wait fit in the queue."""
        bound = self.max_queue
        if priority is Priority.BACKGROUND:
            bound = int(self.max_queue * self.background_share)
        if n > self.n_slots + bound:
            raise InvalidRequest(
                f"this request has {n} prompts; this server runs {self.n_slots} and queues {bound} "
                f"{'background ' if priority is Priority.BACKGROUND else ''}requests at most", "prompt")
        waiting = self._count(TicketState.WAITING)
        free_slots = max(0, self.n_slots - self._count(TicketState.RUNNING))
        over = waiting + n - free_slots - bound
        if over > 0:
            raise QueueFull(max_queue=bound, retry_after_s=self._queue_retry_s(over, stats))

    def _admit_locked(
        self, priority: Priority, prompt_tokens: int, max_tokens: int, stats: EngineStats | None
    ) -> Ticket:
        reserved = sum(t.need_cells for t in self._tickets.values())
        need = prompt_tokens + max_tokens
        retry = self._kv_retry_s(need, reserved, stats)
        check_fits(prompt_tokens, max_tokens, stats, reserved, self.mem_available_bytes,
                   self.reserve_bytes, self.kv_bytes_per_cell, retry_after_s=retry)
        ticket = Ticket(self, next(self._ids), priority, need)
        self._tickets[ticket.ticket_id] = ticket
        self._last_activity_s = self.clock.monotonic()
        return ticket

    def _start(self, ticket: Ticket) -> None:
        with self._lock:
            if ticket.state is TicketState.WAITING:
                ticket.state = TicketState.RUNNING

    def _release(self, ticket: Ticket) -> None:
        with self._lock:
            if self._tickets.pop(ticket.ticket_id, None) is not None:
                ticket.state = TicketState.DONE
                now = self.clock.monotonic()
                self._finished_s.append(now)
                self._last_activity_s = now

    # --- accounting -------------------------------------------------------
    def _count(self, state: TicketState, priority: Priority | None = None) -> int:
        return sum(1 for t in self._tickets.values()
                   if t.state is state and (priority is None or t.priority is priority))

    def queue_state(self) -> QueueState:
        with self._lock:
            return QueueState(
                waiting_interactive=self._count(TicketState.WAITING, Priority.INTERACTIVE),
                waiting_background=self._count(TicketState.WAITING, Priority.BACKGROUND),
                running_interactive=self._count(TicketState.RUNNING, Priority.INTERACTIVE),
                running_background=self._count(TicketState.RUNNING, Priority.BACKGROUND),
                last_activity_s=self._last_activity_s,
            )

    def load(self) -> LoadState:
        """Running and waiting requests against the bounds (readiness, the balancer's weight)."""
        with self._lock:
            return LoadState(running=self._count(TicketState.RUNNING),
                             waiting=self._count(TicketState.WAITING),
                             n_slots=self.n_slots, max_queue=self.max_queue)

    def status(self) -> dict[str, Any]:
        """The queue as /v1/status shows it."""
        q = self.queue_state()
        return {
            "kind": "scheduler" if self.scheduled else "bounded",
            "in_flight": self.in_flight,
            "max_running": self.n_slots,
            "max_queue": self.max_queue,
            "waiting_interactive": q.waiting_interactive,
            "waiting_background": q.waiting_background,
            "running_interactive": q.running_interactive,
            "running_background": q.running_background,
            "rejected": dict(self.rejected),
            "shed": self.shed_count,
        }

    def completions_per_s(self) -> float:
        """Requests finished per second over the last minute."""
        now = self.clock.monotonic()
        while self._finished_s and now - self._finished_s[0] > RATE_WINDOW_S:
            self._finished_s.popleft()
        if not self._finished_s:
            return 0.0
        span = max(1.0, min(RATE_WINDOW_S, now - self._finished_s[0]))
        return len(self._finished_s) / span

    # --- Retry-After ------------------------------------------------------
    def _queue_retry_s(self, places: int, stats: EngineStats | None) -> float:
        rate = self.completions_per_s()
        if rate > 0:
            return _clamp(places / rate)
        tps = _tokens_per_s(stats)
        mean_need = (sum(t.need_cells for t in self._tickets.values()) / len(self._tickets)
                     if self._tickets else 256)
        # no rate measured yet (nothing has run): ask again soon; that answer will carry a measured one
        return _clamp(places * mean_need / tps if tps > 0 else MIN_RETRY_S)

    def _kv_retry_s(self, need: int, reserved: int, stats: EngineStats | None) -> float:
        if stats is None:
            return MIN_RETRY_S
        short = need - free_kv_cells(stats, reserved)
        tps = _tokens_per_s(stats)
        return _clamp(short / tps if tps > 0 else MAX_RETRY_S / 4)

    def _memory_retry_s(self) -> float:
        rate = self.completions_per_s()
        return _clamp(2.0 / rate if rate > 0 else 10.0)


def _tokens_per_s(stats: EngineStats | None) -> float:
    if stats is None or stats.step_time_s <= 0:
        return 0.0
    return (stats.tokens_decoded + stats.tokens_prefilled) / stats.step_time_s


def _clamp(t_s: float) -> float:
    return round(min(MAX_RETRY_S, max(MIN_RETRY_S, t_s)), 1)
