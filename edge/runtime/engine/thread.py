"""The engine thread: mail in, residency (unload, reload) around it, one `StepLoop` step per turn.

The thread sleeps in `Mailbox.take` until there is mail, runnable work, idle work owed
(startup.py: probes deferred past `ready`) or a keep-alive deadline; it reloads an unloaded
model for queued work, runs one step, and honours unload requests and the keep-alive timer
after it; an idle turn runs one slice of the idle work. Decisions about the step itself are in
step/plan.py, their execution in step/loop.py.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from edge.errors import DecodeFailed
from edge.runtime.engine.startup import Startup
from edge.runtime.types import EngineState

if TYPE_CHECKING:
    from edge.clock import Clock
    from edge.runtime.engine.mailbox import LoadWaiter, Mailbox, UnloadWaiter
    from edge.runtime.kv.residency import Residency
    from edge.runtime.step.loop import StepLoop

log = logging.getLogger("edge.engine")

# the prompt caches an unload keeps in host memory, most recent first: about 1300 tokens of
# Qwen2.5 0.5B's KV (12 KiB a token), 700 of SmolLM2-135M's; the rest of the memory is freed
UNLOADED_CACHE_BYTES = 16 << 20


class EngineThread:
    """`run()` is the engine thread's body; `ready` is set once it has warmed the context up
    (probes measured on this device run later, in idle turns: engine/startup.py)."""

    def __init__(self, mailbox: Mailbox, residency: Residency, loop: StepLoop, clock: Clock,
                 startup: Startup | None = None) -> None:
        self.mailbox = mailbox
        self.res = residency
        self.loop = loop
        self.clock = clock
        self.startup = startup or Startup(residency, loop, loop.knobs.n_threads, clock=clock)
        self.ready = threading.Event()

    def run(self) -> None:
        res, loop, idle_work = self.res, self.loop, self.startup.idle
        self.startup.before_ready()  # warm-up and cached probe answers; the rest waits for idle turns
        loop.publish(0.0, 0.0, 0, 0)  # the stats show the attention kind from now on
        self.ready.set()
        while True:
            # take() only consults the timer while no mail is pending, so `idle` is the whole story
            mail = self.mailbox.take(loop.runnable, self._due, self._wait_s)
            if mail.stopping:
                idle_work.suspend()  # its contexts go before Engine.stop frees the weights
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
                if self._idle_turn():
                    idle_work.step()  # one probe decode: a request arriving now waits for no more
            except Exception as exc:  # a bug: fail what was running, keep serving the rest
                log.exception("engine step failed")
                loop.fail_all(DecodeFailed(-100, f"internal error: {exc}"), running_only=True)
                loop.runnable = bool(loop.waiting)
            finally:
                loop.wakeups.flush()

    def _may_probe(self) -> bool:
        """Deferred probes owed and the engine free for them: loaded, idle, not paused (a pause is
        for heat: probes would add to it)."""
        loop = self.loop
        return self.startup.idle.owed and self.res.loaded and loop.idle and not loop.knobs.paused

    def _idle_turn(self) -> bool:
        """Whether this turn runs a slice of the deferred probes: free for them for the grace."""
        return self._may_probe() and self.startup.grace_left_s(self.res.last_active_s) <= 0

    def _due(self) -> bool:
        """A timer is due: the keep-alive, or the probes' grace."""
        return self.res.keep_alive_due(self.loop.idle) or self._idle_turn()

    def _wait_s(self) -> float | None:
        """How long the idle thread may sleep: the keep-alive poll, or until the probes' grace ends."""
        wait_s = self.res.idle_wait_s()
        if self._may_probe():
            left_s = max(0.0, self.startup.grace_left_s(self.res.last_active_s))
            wait_s = left_s if wait_s is None else min(wait_s, left_s)
        return wait_s

    def _reload(self) -> bool:
        """Reload for queued work; on failure fail it and stay UNLOADED (a later request retries)."""
        box, loop = self.mailbox, self.loop
        box.set_state(EngineState.LOADING)
        err = self.res.reload(loop.knobs.n_threads, warm=loop.idle)  # a waiting request warms it itself
        if err is not None:
            box.set_state(EngineState.UNLOADED)  # before the requests hear: they may retry
            loop.fail_all(err)
            loop.publish(0.0, 0.0, 0, 0)
            return False
        loop.context_replaced(keep_host=True)  # what the unload kept of the prompt caches
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
            loop.forget_kv(UNLOADED_CACHE_BYTES)  # their KV went with the context; a few stay in host memory
            box.set_state(EngineState.UNLOADED)

        self.startup.idle.suspend()  # a probe's context goes before the weights it runs over
        live = self.res.live
        if loop.host.on and live.share_prefixes:  # restorable: a conversation resumed later skips its prompt
            loop.kv.stash_idle(live)
        if not self.res.try_unload(still_idle, unloaded):
            return False
        loop.publish(0.0, 0.0, 0, 0)
        return True
