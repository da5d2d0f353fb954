"""Where other threads hand the engine thread new work, knobs, cancels and unload requests.

Everything that goes *to* the engine thread goes through `Mailbox` under one lock,
so the step loop (`step/loop.py`) owns all of its own state and only reads mail.
The other way, tokens go out through each request's handle (handle.py) and stats
as a snapshot replaced whole; `Residency.lock` orders tokenization against swaps:

    any thread                    Mailbox                    engine thread
    submit()  ── post(seq) ──►  new sequences   ──take()──►  EngineThread.run
    apply()   ── set_knobs ──►  knobs
    cancel    ── poke() ─────►  cancel flag
    unload()  ── ask_unload ─►  waiters          ◄── settle ─ Residency
    ensure_loaded() ─ ask_load ► load waiters     ◄── settle ─ Residency
    stop()    ── ask_stop ───►  stopping
              ◄── state ─────  EngineState (set by either side, waited on by anyone)

The engine thread sleeps in `take()` on the condition and wakes for mail, or when
the caller says it has work left (`runnable`) or a timer is due.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from edge.errors import EngineStopped
from edge.runtime.types import EngineState, Knobs, Priority

if TYPE_CHECKING:
    from edge.runtime.embed.embedder import EmbedJob
    from edge.runtime.step.sequence import Sequence

ACCEPTING = frozenset({EngineState.READY, EngineState.PAUSED, EngineState.UNLOADED, EngineState.LOADING})


class UnloadWaiter:
    """One `unload()` call waiting for the engine thread's answer."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.unloaded = False

    def settle(self, unloaded: bool) -> None:
        self.unloaded = unloaded
        self.done.set()


class LoadWaiter:
    """One `ensure_loaded()` call waiting for the engine thread to (re)load the model."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.loaded = False

    def settle(self, loaded: bool) -> None:
        self.loaded = loaded
        self.done.set()


@dataclass
class Mail:
    """What the engine thread takes in one go."""

    new: list[Sequence] = field(default_factory=list)
    embeds: list[EmbedJob] = field(default_factory=list)
    knobs: Knobs | None = None
    cancels: bool = False
    unload_waiters: list[UnloadWaiter] = field(default_factory=list)
    stopping: bool = False
    load_waiters: list[LoadWaiter] = field(default_factory=list)


class Mailbox:
    """Thread-safe hand-off between any thread and the engine thread."""

    def __init__(self, knobs: Knobs) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._new: list[Sequence] = []
        self._embeds: list[EmbedJob] = []
        self._knobs = knobs
        self._dirty = False
        self._cancels = False
        self._stopping = False
        self._unload_waiters: list[UnloadWaiter] = []
        self._load_waiters: list[LoadWaiter] = []
        self._state = EngineState.LOADING

    # --- any thread ---------------------------------------------------------------
    @property
    def state(self) -> EngineState:
        return self._state

    @property
    def knobs(self) -> Knobs:
        return self._knobs

    def set_state(self, state: EngineState) -> None:
        with self._cond:
            self._state = state
            self._cond.notify_all()

    def wait_for_state(self, state: EngineState, timeout_s: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self._state is state, timeout_s)

    def post(self, seq: Sequence) -> None:
        """Queue a sequence; EngineStopped (and nothing queued) once the engine stops accepting."""
        self._post(self._new, seq)

    def post_embed(self, job: EmbedJob) -> None:
        """Queue an embeddings job; EngineStopped once the engine stops accepting."""
        self._post(self._embeds, job)

    def _post(self, queue: list[Any], item: Any) -> None:
        with self._cond:
            if self._state not in ACCEPTING:
                raise EngineStopped(f"engine is {self._state.value}")
            queue.append(item)
            self._wake()

    def set_knobs(self, knobs: Knobs) -> None:
        with self._cond:
            self._knobs = knobs
            if self._state in (EngineState.READY, EngineState.PAUSED):
                self._state = EngineState.PAUSED if knobs.paused else EngineState.READY
            self._wake()

    def poke_cancel(self) -> None:
        with self._cond:
            self._cancels = True
            self._wake()

    def ask_unload(self) -> UnloadWaiter:
        with self._cond:
            if self._state not in (EngineState.READY, EngineState.PAUSED):
                raise EngineStopped(f"cannot unload: engine is {self._state.value}")
            waiter = UnloadWaiter()
            self._unload_waiters.append(waiter)
            self._wake()
            return waiter

    def ask_load(self) -> LoadWaiter:
        with self._cond:
            if self._state not in ACCEPTING:
                raise EngineStopped(f"cannot load: engine is {self._state.value}")
            waiter = LoadWaiter()
            self._load_waiters.append(waiter)
            self._wake()
            return waiter

    def begin_drain(self) -> bool:
        """DRAINING: no new work. False when the engine had already stopped or failed."""
        with self._cond:
            if self._state in (EngineState.STOPPED, EngineState.FAILED):
                return False
            self._state = EngineState.DRAINING
            self._wake()
            return True

    def ask_stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._wake()

    def wake(self) -> None:
        """Let the engine thread look at its timers now (tests with a manual clock)."""
        with self._cond:
            self._cond.notify_all()

    def pending(self) -> tuple[int, int]:
        """(posted, posted interactive) not yet taken by the engine thread."""
        with self._cond:
            return len(self._new), sum(1 for s in self._new if s.request.priority is Priority.INTERACTIVE)

    def pending_embeds(self) -> int:
        with self._cond:
            return len(self._embeds)

    def take_new(self) -> tuple[list[Sequence], list[EmbedJob]]:
        """Everything posted so far (shutdown: the engine thread has stopped)."""
        with self._cond:
            new, self._new = self._new, []
            embeds, self._embeds = self._embeds, []
            return new, embeds

    def quiet(self) -> bool:
        """Nothing posted and the engine serving (READY or PAUSED): it may unload."""
        with self._cond:
            serving = self._state in (EngineState.READY, EngineState.PAUSED)
            return not self._new and not self._embeds and serving

    # --- engine thread --------------------------------------------------------------
    def take(self, runnable: bool, due: Callable[[], bool], wait_s: Callable[[], float | None]) -> Mail:
        """Wait until there is mail, `runnable` work or a due timer; then take all mail at once."""
        with self._cond:
            while not self._dirty and not runnable and not due():
                self._cond.wait(wait_s())
            self._dirty = False
            mail = Mail(self._new, self._embeds, self._knobs, self._cancels, self._unload_waiters,
                        self._stopping, self._load_waiters)
            self._new, self._embeds, self._unload_waiters, self._cancels = [], [], [], False
            self._load_waiters = []
            return mail

    def _wake(self) -> None:
        self._dirty = True
        self._cond.notify_all()
