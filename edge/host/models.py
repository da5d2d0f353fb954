"""`ModelHost`: every model in the store from one endpoint, resident within one memory budget.

A request takes a `Lease` on the model it names (`acquire`, blocking: call it off the event
loop). The lease loads the model if it is not resident, after unloading idle models that
`residency.plan_room` picks, and holds it resident until released: an engine with a lease
never unloads (its own keep-alive timer is held off while leased). Loads run outside the
host's lock, but their bytes are counted from the moment they are decided, so two loads
never race past the budget. A request for a model that is loading waits for that load.

The host is also the one engine the scheduler turns (`apply`, `stats`, `unload`, `state`):
the box's knobs are shared among the busy models (`share.share_knobs`), so two models
decoding at once hold the heat and power one would.

Engines are built by `build` (production: `edge.host.loading`), planned against the whole
budget (not what happens to be free), so a model's context and size do not depend on what
else was resident when it first loaded.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edge.contracts.engine import EngineState, EngineStats, Knobs
from edge.errors import EdgeError, ModelLoadError, ModelTooLarge
from edge.host.hosted import Hosted, Lease
from edge.host.names import ModelNames, ModelRef
from edge.host.residency import ModelState, RoomVerdict, plan_room, victim_for_memory
from edge.host.share import combined_stats, host_state, share_knobs

if TYPE_CHECKING:
    from edge.planner import MemoryPlan
    from edge.runtime.types import EngineLike

log = logging.getLogger("edge.host")

# (model file, planning budget in bytes) -> the plan, and (file, plan) -> an unstarted engine
Planner = Callable[[Path, int], "MemoryPlan"]
Builder = Callable[[Path, "MemoryPlan"], "EngineLike"]


class ModelHost:
    def __init__(self, names: ModelNames, budget_bytes: int, *, plan: Planner, build: Builder,
                 n_slots: int, knobs: Knobs, keep_alive_s: float | None = None,
                 pins: Sequence[str] = (), clock: Callable[[], float] = time.monotonic,
                 load_timeout_s: float = 600.0, preload: bool = True) -> None:
        self.names = names
        self.budget_bytes = budget_bytes
        self.n_slots = n_slots
        self.keep_alive_s = keep_alive_s
        self._plan, self._build, self._clock = plan, build, clock
        self._pins = {names.resolve(p).key for p in pins}
        self._knobs = knobs
        self._models: dict[str, Hosted] = {}
        self._cv = threading.Condition()
        self._load_timeout_s = load_timeout_s
        self._stopped = False
        self._preload = preload
        self._started = not (preload and names.given_keys())  # LOADING until the preloads are in

    # --- requests -------------------------------------------------------------------------

    def acquire(self, name: str) -> Lease:
        """Hold the model `name` resident, loading it first if needed (blocking). Raises
        ModelNotFound (404), ModelTooLarge (507), ModelLoadError, InvalidGGUF."""
        ref = self.names.resolve(name)
        t0 = self._clock()
        with self._cv:
            h = self._hosted(ref)
            self._take(h)
            h.waiting += 1
            try:
                victims = self._wait_for_room(h)
            except BaseException:
                h.waiting -= 1
                self._give_back(h)
                raise
        if h.state is ModelState.LOADING:
            self._load(h, victims)
        with self._cv:
            h.waiting -= 1
            engine = h.engine
        assert engine is not None
        return Lease(self, h, engine, load_s=self._clock() - t0)

    def acquire_resident(self, name: str) -> Lease | None:
        """A lease at once if `name` is resident and ready (no blocking: the event loop may call
        it), else None: then `acquire` in a worker thread. Raises ModelNotFound for an unknown name
        only when it is known to the index (a miss re-reads the store: let `acquire` do that)."""
        ref = self.names.lookup(name)
        if ref is None:
            return None
        with self._cv:
            h = self._models.get(ref.key)
            if h is None or h.state is not ModelState.READY or h.engine is None \
                    or (h.leases == 0 and h.engine.state is EngineState.UNLOADED):
                return None
            self._take(h)
            return Lease(self, h, h.engine)

    def _hosted(self, ref: ModelRef) -> Hosted:
        h = self._models.get(ref.key)
        if h is None:
            pinned = ref.key in self._pins
            h = self._models[ref.key] = Hosted(ref, pinned, None if pinned else self.keep_alive_s)
        return h

    def _take(self, h: Hosted) -> None:
        h.leases += 1
        h.last_used_s = self._clock()
        if h.leases == 1 and h.engine is not None and h.state is ModelState.READY:
            h.engine.set_keep_alive(None)  # leased: its own idle timer must not unload it
            self._share()

    def _wait_for_room(self, h: Hosted) -> tuple[Hosted, ...] | None:
        """Under the lock: wait until `h` is READY (None) or this thread is to load it (the models
        to unload first). The load's bytes count from here."""
        deadline = self._clock() + self._load_timeout_s
        saw_load = False
        while True:
            self._sync()
            if self._stopped:
                raise ModelLoadError(h.ref.key, "the server is stopping")
            if h.state is ModelState.READY:
                return None
            if h.state is ModelState.FAILED and saw_load:  # the load this request waited for failed
                raise ModelLoadError(h.ref.key, h.error)
            saw_load = saw_load or h.state is ModelState.LOADING
            if h.state in (ModelState.COLD, ModelState.FAILED):
                if h.plan is None:
                    h.plan = self._plan(h.ref.path, self.budget_bytes)
                room = plan_room([m.view() for m in self._models.values()], h.ref.key, h.planned_bytes,
                                 self.budget_bytes)
                if room.verdict is RoomVerdict.TOO_LARGE or not h.plan.fits:
                    raise ModelTooLarge(h.ref.key, h.planned_bytes, self.budget_bytes,
                                        h.plan.reason or room.reason)
                if room.verdict is RoomVerdict.FITS:
                    victims = tuple(self._models[k] for k in room.evict)
                    for v in victims:
                        v.state = ModelState.UNLOADING
                    h.state, h.error = ModelState.LOADING, ""
                    log.info("loading %s (%s)", h.ref.key, room.reason)
                    return victims
                log.info("%s waits for room: %s", h.ref.key, room.reason)
            left_s = deadline - self._clock()
            if left_s <= 0:
                raise ModelLoadError(h.ref.key, f"no room within {self._load_timeout_s:.0f} s")
            self._cv.wait(min(left_s, 1.0))

    def _load(self, h: Hosted, victims: tuple[Hosted, ...] | None) -> None:
        """Outside the lock: unload the victims, then load `h`; wakes every waiter either way."""
        try:
            for v in victims or ():
                self._unload_engine(v)
            t_s = self._clock()
            if h.engine is None:
                assert h.plan is not None
                h.engine = self._build(h.ref.path, h.plan)
                h.engine.start()
            elif not h.engine.ensure_loaded(self._load_timeout_s):
                raise ModelLoadError(h.ref.key, "the model could not be loaded; see the server log")
            if h.engine.state not in (EngineState.READY, EngineState.PAUSED):
                raise ModelLoadError(h.ref.key, f"engine is {h.engine.state.value}")
        except BaseException as exc:
            with self._cv:
                h.state, h.error = ModelState.FAILED, str(exc)
                h.waiting -= 1
                self._give_back(h)
                if h.engine is not None and h.engine.state in (EngineState.FAILED, EngineState.STOPPED):
                    h.engine, h.applied = None, None
                self._cv.notify_all()
            log.error("loading %s failed: %s", h.ref.key, exc)
            if isinstance(exc, EdgeError):
                raise
            raise ModelLoadError(h.ref.key, str(exc)) from exc
        with self._cv:
            h.engine.set_keep_alive(None)
            h.state, h.loads, h.last_load_s = ModelState.READY, h.loads + 1, self._clock() - t_s
            self._share()
            self._cv.notify_all()
        log.info("%s loaded in %.2f s (%d MiB planned)", h.ref.key, h.last_load_s, h.planned_bytes >> 20)

    def _unload_engine(self, v: Hosted) -> None:
        ok = v.engine is not None and v.engine.unload()
        with self._cv:
            v.state = ModelState.COLD if ok or v.engine is None else ModelState.READY
            self._cv.notify_all()
        log.info("unloaded %s to make room" if ok else "could not unload %s (busy)", v.ref.key)

    def _release(self, h: Hosted) -> None:
        with self._cv:
            self._give_back(h)
            self._cv.notify_all()

    def _give_back(self, h: Hosted) -> None:
        h.leases = max(0, h.leases - 1)
        h.last_used_s = self._clock()
        if h.leases == 0:
            if h.engine is not None and h.state is ModelState.READY:
                h.engine.set_keep_alive(h.keep_alive_s)  # 0: unloads as soon as it is idle
            self._share()

    def _sync(self) -> None:
        """Models whose engine unloaded itself (keep-alive) no longer hold memory."""
        for h in self._models.values():
            if h.state is ModelState.READY and h.engine is not None and h.leases == 0 \
                    and h.engine.state is EngineState.UNLOADED:
                h.state = ModelState.COLD

    # --- per-model controls (Ollama's keep_alive, load and unload requests, /api/delete) --------

    def set_keep_alive(self, name: str, keep_alive_s: float | None) -> None:
        """The model's idle time before it unloads, from its next idle moment (pinned: never)."""
        with self._cv:
            h = self._hosted(self.names.resolve(name))
            if not h.pinned:
                h.keep_alive_s = keep_alive_s
            if h.leases == 0 and h.engine is not None and h.state is ModelState.READY:
                h.engine.set_keep_alive(h.keep_alive_s)

    def expires_in_s(self, name: str) -> float | None:
        """Seconds until the idle model `name` unloads on its own (None: busy, forever, not resident)."""
        with self._cv:
            h = self._models.get(self.names.resolve(name).key)
            if h is None or h.engine is None or h.state is not ModelState.READY or h.leases:
                return None
        return h.engine.residency_status().expires_in_s

    def keep_expiry(self, name: str, expires_in_s: float) -> None:
        """Put an idle model's unload time back where it was before a health probe used it: a probe
        is not use, and must not keep an idle model resident."""
        with self._cv:
            h = self._models.get(self.names.resolve(name).key)
            if h is not None and h.engine is not None and h.state is ModelState.READY and not h.leases:
                h.engine.set_keep_alive(max(0.0, expires_in_s))

    def unload_model(self, name: str) -> bool:
        """Unload `name` now if it is idle (True); a busy model unloads when its requests end."""
        with self._cv:
            h = self._hosted(self.names.resolve(name))
            self._sync()
            if h.state is not ModelState.READY:
                return h.state is ModelState.COLD or h.state is ModelState.FAILED
            if h.leases:
                h.keep_alive_s = 0.0 if not h.pinned else None
                return False
            h.state = ModelState.UNLOADING
        self._unload_engine(h)
        return h.state is ModelState.COLD

    def import_runtime(self) -> None:
        """Import what a load runs (llama.cpp's bindings, the GGUF reader, the engine) on the caller's
        thread: a start that then imports its API beside the load holds the GIL for imports while
        the load runs in C, rather than the two threads taking turns at importing."""
        import edge.gguf
        import edge.planner
        import edge.runtime.engine.core  # noqa: F401

    def start(self) -> None:
        """Load the models named at start, in order (blocking); raises what the first failure raised.
        Without preloading (`--lazy`) nothing loads before its first request."""
        for key in self.names.given_keys() if self._preload else ():
            self.acquire(key).release()
        self._started = True

    def stop(self, drain_timeout_s: float = 0.0) -> None:
        with self._cv:
            self._stopped = True
            engines = [h.engine for h in self._models.values() if h.engine is not None]
            self._cv.notify_all()
        for e in engines:
            e.stop(drain_timeout_s)

    # --- what it holds ---------------------------------------------------------------------------

    def resident(self) -> list[Hosted]:
        with self._cv:
            self._sync()
            return [h for h in self._models.values() if h.state.holds_memory]

    def held_bytes(self) -> int:
        return sum(h.planned_bytes for h in self.resident())

    def models(self) -> list[Hosted]:
        with self._cv:
            self._sync()
            return list(self._models.values())

    def status(self) -> list[dict[str, Any]]:
        """Per model, for /v1/status, `edge status` and /metrics."""
        now = self._clock()
        out = []
        for h in self.models():
            res = h.engine.residency_status() if h.engine is not None and h.state is ModelState.READY \
                else None
            out.append({"model": h.ref.key, "state": h.state.value, "planned_bytes": h.planned_bytes,
                        "requests": h.leases - h.waiting, "waiting_for_load": h.waiting,
                        "last_used_s_ago": round(now - h.last_used_s, 3) if h.last_used_s else None,
                        "pinned": h.pinned, "keep_alive_s": h.keep_alive_s,
                        "expires_in_s": None if res is None or h.leases else res.expires_in_s,
                        "loads": h.loads, "last_load_s": round(h.last_load_s, 3), "error": h.error or None})
        return out

    # --- the one engine the scheduler turns -------------------------------------------------------

    def _share(self) -> None:
        """Under the lock: each busy engine gets its share of the box's knobs, idle ones the whole."""
        ready = [h for h in self._models.values() if h.state is ModelState.READY and h.engine is not None]
        busy = [h for h in ready if h.leases > 0]
        for h in ready:
            assert h.engine is not None
            knobs = share_knobs(self._knobs, len(busy)) if h in busy else self._knobs
            if knobs != h.applied:  # a change only: each request's lease must not wake the engine
                h.engine.apply(knobs)
                h.applied = knobs

    def apply(self, knobs: Knobs) -> None:
        with self._cv:
            self._knobs = knobs
            self._share()

    def stats(self) -> EngineStats:
        with self._cv:
            self._sync()
            engines = [h.engine for h in self._models.values()
                       if h.engine is not None and h.state is ModelState.READY]
            loading_bytes = sum(h.planned_bytes for h in self._models.values()
                                if h.state is ModelState.LOADING)
            knobs = self._knobs
        stats = [e.stats() for e in engines]
        state = host_state([s.state for s in stats], loading_bytes > 0 or not self._started)
        return combined_stats(stats, knobs, self.n_slots, max((e.n_ctx for e in engines), default=0), state,
                              loading_bytes)

    @property
    def n_ctx(self) -> int:
        """The largest context of the resident models (0: none resident)."""
        return max((h.engine.n_ctx for h in self.resident() if h.engine is not None), default=0)

    @property
    def model_name(self) -> str:
        """The first model named at start (what a single-model client sees first)."""
        given = self.names.given_keys()
        return given[0] if given else ""

    @property
    def state(self) -> EngineState:
        with self._cv:
            self._sync()
            states = [h.engine.state for h in self._models.values()
                      if h.engine is not None and h.state is ModelState.READY]
            loading = any(h.state is ModelState.LOADING for h in self._models.values()) or not self._started
        return host_state(states, loading)

    def unload(self, timeout_s: float | None = 60.0) -> bool:
        """The scheduler's eviction under a memory emergency: the least recently used idle model."""
        with self._cv:
            self._sync()
            key = victim_for_memory([h.view() for h in self._models.values()])
            if key is None:
                return False
            victim = self._models[key]
            victim.state = ModelState.UNLOADING
        self._unload_engine(victim)
        return victim.state is ModelState.COLD
