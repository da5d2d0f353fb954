"""What the engine thread does between loading and `ready`, and what it leaves for idle turns.

Before `ready` only what the first request would otherwise pay for itself: the warm-up decode
(first-touch page faults of the weights, the OpenMP team, one-time backend allocations) and
answers that earlier starts measured (the probe cache, llama/probe_cache.py). What edge
measures about this device (the attention kind under `--flash-attn fastest`, the verify-step
cost curve while speculating) can run after the first token, so it does: `IdleWork` runs
it in the engine thread's idle turns, one decode per turn, once the engine has been idle for
IDLE_GRACE_S (a request sent as soon as `/ready` says so, or the next one of a burst, finds no
probe in its way), so a request that arrives meanwhile waits one probe decode at most. An
unload suspends it (its contexts go before the weights); it starts over after the reload,
keeping what it had measured.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from edge.clock import Clock, SystemClock
from edge.runtime.llama.probe_cache import ProbeCache, build_identity, probe_key
from edge.runtime.spec import calibration
from edge.runtime.spec.calibration import CALIBRATE_DEPTH, load_curve, save_curve

if TYPE_CHECKING:
    from edge.runtime.kv.residency import Residency
    from edge.runtime.llama.model import ContextConfig, LlamaModel
    from edge.runtime.step.loop import StepLoop

log = logging.getLogger("edge.engine")

IDLE_GRACE_S = 0.5  # idle this long (engine clock) before a probe decodes

CurveProbe = Callable[["LlamaModel", "ContextConfig", int, dict[int, float]], Iterator[None]]


class IdleWork:
    """Tasks run one slice per idle engine turn; a task is a generator made on demand (one
    decode per `next`)."""

    def __init__(self) -> None:
        self._tasks: deque[tuple[str, Callable[[], Iterator[None]]]] = deque()
        self._now: Iterator[None] | None = None
        self.done: list[str] = []  # finished tasks, in order (logs, tests)
        self.finished = threading.Event()  # set while nothing is owed (benchmarks wait for it)
        self.finished.set()

    @property
    def owed(self) -> bool:
        return bool(self._tasks)

    @property
    def names(self) -> list[str]:
        """The tasks owed, in order."""
        return [name for name, _ in self._tasks]

    def add(self, name: str, make: Callable[[], Iterator[None]]) -> None:
        self.finished.clear()
        self._tasks.append((name, make))

    def step(self) -> None:
        """Run the first task one slice on (engine thread: idle, model loaded). A failure only
        costs the head start it would have given: logged, and the task dropped."""
        name, make = self._tasks[0]
        try:
            if self._now is None:
                self._now = make()
            next(self._now)
            return
        except StopIteration:
            self.done.append(name)
        except Exception as exc:
            log.warning("%s failed: %s", name, exc)
        self._now = None
        self._tasks.popleft()
        if not self._tasks:
            self.finished.set()

    def suspend(self) -> None:
        """Before the weights go (unload, stop): close the running task, which frees its
        context; it is made anew at the next idle turn with the model loaded."""
        if self._now is not None:
            self._now.close()
            self._now = None


class Startup:
    """The engine thread's start-up: `before_ready()`, then `idle` owns the deferred probes."""

    def __init__(self, res: Residency, loop: StepLoop, n_threads: int, *, clock: Clock | None = None,
                 cache: ProbeCache | None = None, build: Callable[[], str] = build_identity,
                 measure_curve: CurveProbe | None = None, grace_s: float = IDLE_GRACE_S) -> None:
        self.res = res
        self.loop = loop
        self.n_threads = n_threads  # the threads the probes run and are kept with
        self.clock = clock or SystemClock()
        self.grace_s = grace_s
        self.ready_s = self.clock.monotonic()  # reset by before_ready
        self.cache = cache or ProbeCache(calibration.KIND)
        self.build = build
        self.measure_curve = measure_curve or calibration.measure_steps
        self.idle = IdleWork()
        self.measured: dict[int, float] = {}  # the verify-cost curve so far (survives a suspend)

    def before_ready(self) -> None:
        """Warm up, take what earlier starts measured, queue the rest for idle turns (never
        raises: none of it is needed to serve)."""
        self.res.warm_up()  # on the engine thread: see Residency.open
        self._adopt_primed()
        self.ready_s = self.clock.monotonic()
        try:
            if self.res.attention_owed():
                self.idle.add("attention probe", self._attention)
                self.idle.add("verify-cost calibration", self._calibrate)  # after: its key has the kind
            elif self._curve_n_max() > 0 and not self._seed_from_cache():
                self.idle.add("verify-cost calibration", self._calibrate)
        except Exception as exc:  # e.g. the model file gone since the load: no head start
            log.warning("cached probe answers not read: %s", exc)
        self.idle.add("vocabulary-only model", self.res.vocab_steps)  # what an unload keeps

    def _adopt_primed(self) -> None:
        """The chat template's head, decoded into sequence 0 before the engine had the context
        (llama/prime.py), becomes slot 0's prompt cache: the first chat reuses it."""
        if not self.res.loaded:
            return
        ctx = self.res.live.ctx
        ctx.settle()  # without a warm-up (EngineConfig.warmup) nothing else waited for it
        if ctx.primed:
            self.loop.slots[0].tokens[:] = ctx.primed
            log.info("chat template's first %d tokens evaluated during the start", len(ctx.primed))
            ctx.primed = ()

    def grace_left_s(self, last_work_s: float) -> float:
        """Seconds until idle work may run, counted from ready or the last work, whichever is later."""
        return self.grace_s - (self.clock.monotonic() - max(self.ready_s, last_work_s))

    def _curve_n_max(self) -> int:
        spec, res = self.loop.spec, self.res
        if not spec.on or not res.loaded:
            return 0
        live = res.live
        return max(0, min(spec.k + 1, live.batch.capacity, live.n_ctx_seq - CALIBRATE_DEPTH))

    def _curve_key(self, n_max: int) -> str:
        res = self.res
        return probe_key(res.spec.model_path, self.build(), self.n_threads, calibration.KIND, n_max,
                         CALIBRATE_DEPTH, res.flash_attn, res.spec.kv_type, res.spec.n_gpu_layers)

    def _seed_from_cache(self) -> bool:
        n_max = self._curve_n_max()
        curve = load_curve(self.cache, self._curve_key(n_max), n_max)
        if curve is not None:
            self.loop.spec.seed(curve)
        return curve is not None

    def _attention(self) -> Iterator[None]:
        replaced = yield from self.res.attention_steps(self.n_threads)
        if replaced:
            self.loop.context_replaced()  # an empty context of the other kind: the caches went
        self.loop.publish(0.0, 0.0, 0, 0)  # the stats show the attention kind from now on

    def _calibrate(self) -> Iterator[None]:
        n_max = self._curve_n_max()
        if n_max < 1 or self._seed_from_cache():
            return
        live = self.res.live
        yield from self.measure_curve(live.model, self.res.context_config(self.n_threads), n_max,
                                      self.measured)
        curve = {n: s for n, s in self.measured.items() if n <= n_max}
        save_curve(self.cache, self._curve_key(n_max), curve)
        self.loop.spec.seed(curve)
        log.info("verify-step costs measured: %s", ", ".join(f"{n}: {s * 1e3:.1f} ms" for n, s in
                                                              sorted(curve.items())))
