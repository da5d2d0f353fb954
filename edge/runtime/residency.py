"""Keep-alive: unloading the weights of an idle engine and reloading them on demand.

A small box that serves a chat now and then should not hold a model's memory all day
(issue 5): after `keep_alive_s` without work the engine thread frees the context (KV
cache, compute buffers) and the weights, and keeps only a vocabulary-only model (a few
MiB) so that tokenization and chat rendering, which the API does before queueing, keep
working. The next request is queued as usual; the engine thread sees work while
unloaded, reloads (the request simply waits), and carries on. A failed reload fails the
waiting requests with ModelLoadError and leaves the engine UNLOADED so a later request
retries (memory may have been freed meanwhile).

Everything that touches the context runs on the engine thread; other threads only ask
(`unload()`) and wait. `_model_lock` orders model swaps against `submit`/`tokenize` on
other threads, so no thread uses a model while it is freed.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import threading
from typing import TYPE_CHECKING

from edge.errors import EngineStopped, ModelLoadError
from edge.runtime.model import LlamaModel
from edge.runtime.slots import SlotState
from edge.runtime.types import EngineState

if TYPE_CHECKING:
    from edge.clock import Clock
    from edge.runtime.batch import Batch
    from edge.runtime.model import LlamaContext
    from edge.runtime.sequence import Sequence
    from edge.runtime.slots import Slot
    from edge.runtime.types import Knobs

log = logging.getLogger("edge.engine")


def _trim_heap() -> None:
    """Give freed heap pages back to the OS (glibc keeps them otherwise, so the unload would
    not show in RSS or MemAvailable); a no-op where there is no glibc."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)


class _UnloadWaiter:
    def __init__(self) -> None:
        self.done = threading.Event()
        self.unloaded = False


class Residency:
    """Mixed into `Engine`; every attribute below is set by `Engine.__init__`."""

    model_path: str
    model: LlamaModel | None
    _ctx: LlamaContext | None
    _vocab: LlamaModel | None
    _batch: Batch
    _cond: threading.Condition
    _model_lock: threading.Lock
    _inbox: list[Sequence]
    _waiting: list[tuple[tuple[int, int], int, Sequence]]
    _running: dict[int, Sequence]
    _slots: list[Slot]
    _state: EngineState
    _knobs: Knobs
    _dirty: bool
    _thread: threading.Thread | None
    _clock: Clock
    _keep_alive_s: float | None
    _idle_poll_s: float
    _unload_waiters: list[_UnloadWaiter]
    _last_active_s: float

    if TYPE_CHECKING:

        def _publish_stats(self, step_s: float, decode_s: float, n_dec: int, n_pre: int) -> None: ...

    # --- any thread ---------------------------------------------------------

    def unload(self, timeout_s: float | None = 60.0) -> bool:
        """Free the weights and the context if the engine is idle (state becomes UNLOADED).
        Returns True when unloaded (or already), False when there was work (nothing is
        touched then) or the engine thread did not answer within `timeout_s`."""
        with self._cond:
            if self._state is EngineState.UNLOADED:
                return True
            if self._thread is None or self._state not in (EngineState.READY, EngineState.PAUSED):
                raise EngineStopped(f"cannot unload: engine is {self._state.value}")
            waiter = _UnloadWaiter()
            self._unload_waiters.append(waiter)
            self._dirty = True
            self._cond.notify_all()
        waiter.done.wait(timeout_s)
        return waiter.unloaded

    def tick(self) -> None:
        """Wake the engine thread to look at its idle timer now (tests with a manual clock;
        in production it looks every `idle_poll_s` anyway)."""
        with self._cond:
            self._cond.notify_all()

    def wait_for_state(self, state: EngineState, timeout_s: float = 60.0) -> bool:
        """Block until the engine reaches `state` (True) or `timeout_s` passes (False)."""
        with self._cond:
            return self._cond.wait_for(lambda: self._state is state, timeout_s)

    @property
    def keep_alive_s(self) -> float | None:
        return self._keep_alive_s

    # --- engine thread ------------------------------------------------------

    def _idle(self) -> bool:
        """No queued, waiting or admitted work (call with `_cond` held or on the engine thread
        right after taking the inbox)."""
        return not (self._inbox or self._waiting or self._running)

    def _keep_alive_due(self) -> bool:
        ka = self._keep_alive_s
        if ka is None or self._ctx is None or not self._idle():
            return False
        return self._clock.monotonic() - self._last_active_s >= ka

    def _idle_wait_s(self) -> float | None:
        """How long the idle engine thread may sleep: forever unless a keep-alive can expire."""
        return None if self._keep_alive_s is None or self._ctx is None else self._idle_poll_s

    def _settle_unloads(self, waiters: list[_UnloadWaiter]) -> None:
        """After a step: honour unload requests and the keep-alive timer."""
        if not waiters and not self._keep_alive_due():
            return
        ok = self._ctx is None or self._try_unload()
        if not ok:  # busy or failed: the keep-alive starts over instead of retrying in a spin
            self._last_active_s = self._clock.monotonic()
        for w in waiters:
            w.unloaded = ok
            w.done.set()

    def _try_unload(self) -> bool:
        assert self._ctx is not None
        try:
            vocab = self._vocab or LlamaModel(self.model_path, vocab_only=True)
        except ModelLoadError as exc:  # keep serving; unloading is only an optimisation
            log.warning("not unloading: vocabulary-only load failed: %s", exc)
            return False
        self._vocab = vocab
        with self._model_lock:  # submit() holds it too: no new work can arrive from here on
            with self._cond:
                if not self._idle() or self._state not in (EngineState.READY, EngineState.PAUSED):
                    return False
            full, ctx = self.model, self._ctx
            self.model, self._ctx = vocab, None
            self._batch.free()
            ctx.close()
            if full is not None and full is not vocab:
                full.close()
            _trim_heap()
            for slot in self._slots:  # their KV went with the context
                slot.tokens.clear()
                slot.state = SlotState.IDLE
            with self._cond:  # only now: whoever waits for UNLOADED sees the memory freed
                self._state = EngineState.UNLOADED
                self._cond.notify_all()
        self._publish_stats(0.0, 0.0, 0, 0)
        log.info("model unloaded after %.0f s idle", self._clock.monotonic() - self._last_active_s)
        return True

    def _reload(self) -> bool:
        """Load weights and context again for queued work; False (work failed) on error."""
        with self._cond:
            self._state = EngineState.LOADING
            self._cond.notify_all()
        t0_s = self._clock.monotonic()
        try:
            model, ctx = self._open()
        except Exception as exc:
            err = exc if isinstance(exc, ModelLoadError) else ModelLoadError(self.model_path, str(exc))
            log.error("reload failed: %s", err)
            with self._cond:  # before the requests hear of it: they may retry at once
                self._state = EngineState.UNLOADED
                self._cond.notify_all()
            self._fail_all(err)
            self._publish_stats(0.0, 0.0, 0, 0)
            return False
        self._install(model, ctx)
        with self._cond:
            self._state = EngineState.PAUSED if self._knobs.paused else EngineState.READY
            self._cond.notify_all()
        self._last_active_s = self._clock.monotonic()
        log.info("model reloaded in %.2f s", self._last_active_s - t0_s)
        return True

    if TYPE_CHECKING:  # provided by Engine and StepLoop (stubs here would shadow them)

        def _open(self) -> tuple[LlamaModel, LlamaContext]: ...

        def _install(self, model: LlamaModel, ctx: LlamaContext) -> None: ...

        def _fail_all(self, err: Exception, running_only: bool = False) -> None: ...
