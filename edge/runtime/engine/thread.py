"""The engine thread: mail in, residency (unload, reload) around it, one `StepLoop` step per turn.

The thread sleeps in `Mailbox.take` until there is mail, runnable work or a keep-alive
deadline; it reloads an unloaded model for queued work, runs one step, and honours unload
requests and the keep-alive timer after it. Decisions about the step itself are in
step/plan.py, their execution in step/loop.py.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from edge.errors import DecodeFailed
from edge.runtime.types import EngineState

if TYPE_CHECKING:
    from edge.clock import Clock
    from edge.runtime.engine.mailbox import LoadWaiter, Mailbox, UnloadWaiter
    from edge.runtime.kv.residency import Residency
    from edge.runtime.step.loop import StepLoop

log = logging.getLogger("edge.engine")


class EngineThread:
    """`run()` is the engine thread's body; `ready` is set once it has warmed the context up."""

    def __init__(self, mailbox: Mailbox, residency: Residency, loop: StepLoop, clock: Clock) -> None:
        self.mailbox = mailbox
        self.res = residency
        self.loop = loop
        self.clock = clock
        self.ready = threading.Event()

    def run(self) -> None:
        res, loop = self.res, self.loop
        try:
            res.choose_attention(loop.knobs.n_threads)  # times both kinds where free (attention.py)
        except Exception as exc:  # only an optimisation: the context as opened serves
            log.warning("attention choice failed: %s", exc)
        loop.publish(0.0, 0.0, 0, 0)  # the stats show the attention kind from now on
        res.warm_up()  # on this thread: see Residency.open
        if loop.spec.on and res.loaded:
            try:
                loop.spec.calibrate(res.live)  # the verify-step cost curve (spec/state.py)
            except Exception as exc:  # only a head start: the steps measure it anyway
                log.warning("verify-cost calibration failed: %s", exc)
        self.ready.set()
        while True:
            # take() only consults the timer while no mail is pending, so `idle` is the whole story
            mail = self.mailbox.take(loop.runnable, lambda: res.keep_alive_due(loop.idle), res.idle_wait_s)
            if mail.stopping:
                return
            loop.take(mail)
            busy = not loop.idle or bool(mail.load_waiters)  # a load request is work to load for
            t_step_s = self.clock.monotonic()  # not after the step: a caller may move a test clock
            try:
                if not res.loaded and busy and not self._reload():
                    self._settle_loads(mail.load_waiters)
                    self._settle_unloads(mail.unload_waiters)
                    continue
                self._settle_loads(mail.load_waiters)
                if res.loaded:
                    loop.iterate(mail.cancels)
                if busy or not loop.idle:
                    res.touch(t_step_s)
                self._settle_unloads(mail.unload_waiters)
            except Exception as exc:  # a bug: fail what was running, keep serving the rest
                log.exception("engine step failed")
                loop.fail_all(DecodeFailed(-100, f"internal error: {exc}"), running_only=True)
                loop.runnable = bool(loop.waiting)
            finally:
                loop.wakeups.flush()

    def _reload(self) -> bool:
        """Reload for queued work; on failure fail it and stay UNLOADED (a later request retries)."""
        box, loop = self.mailbox, self.loop
        box.set_state(EngineState.LOADING)
        err = self.res.reload(loop.knobs.n_threads)
        if err is not None:
            box.set_state(EngineState.UNLOADED)  # before the requests hear: they may retry
            loop.fail_all(err)
            loop.publish(0.0, 0.0, 0, 0)
            return False
        loop.context_replaced()
        box.set_state(EngineState.PAUSED if loop.knobs.paused else EngineState.READY)
        loop.publish(0.0, 0.0, 0, 0)
        return True

    def _settle_loads(self, waiters: list[LoadWaiter]) -> None:
        for w in waiters:
            w.settle(self.res.loaded)

    def _settle_unloads(self, waiters: list[UnloadWaiter]) -> None:
        """After a step: honour unload requests and the keep-alive timer."""
        res = self.res
        if not waiters and not res.keep_alive_due(self.loop.idle):
            return
        ok = not res.loaded or self._try_unload()
        if not ok:  # busy or failed: the keep-alive starts over instead of retrying in a spin
            res.restart_keep_alive()
        for w in waiters:
            w.settle(ok)

    def _try_unload(self) -> bool:
        box, loop = self.mailbox, self.loop

        def still_idle() -> bool:  # called under the residency lock, which every submit holds
            return loop.idle and box.quiet()

        def unloaded() -> None:
            loop.forget_kv()  # their KV went with the context
            box.set_state(EngineState.UNLOADED)

        if not self.res.try_unload(still_idle, unloaded):
            return False
        loop.publish(0.0, 0.0, 0, 0)
        return True
