"""The scheduler loop: poll telemetry, decide, apply. Thin on purpose.

All judgement is in `controller.decide()`; this file only moves data between the
monitor, the engine and admission, logs every change with its reason, and keeps
the last decision and counters for /v1/status and /metrics.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol

from edge.clock import Clock, SystemClock
from edge.contracts.engine import EngineState, EngineStats, Knobs
from edge.scheduler.admission import Admission
from edge.scheduler.controller import decide
from edge.scheduler.headroom import limits_of
from edge.scheduler.reasoning import ThinkingBudget, thinking_budget
from edge.scheduler.state import (
    ControlInput,
    ControllerConfig,
    ControllerState,
    Decision,
    LimitHeadroom,
    QueueState,
    ThermalMode,
)
from edge.telemetry.monitor import MonitorReading, TelemetrySource

log = logging.getLogger("edge.scheduler")

INTERVAL_S = 1.0  # poll period when cool
FAST_INTERVAL_S = 0.5  # poll period while limiting, paused or guarding
CAPPED_INTERVAL_S = 0.25  # while CPU contention holds threads back: they return this soon (contention.py)


class MonitorLike(Protocol):
    """The telemetry monitor as the loop uses it (telemetry.monitor.Monitor)."""

    source: TelemetrySource

    def poll(self, now_s: float, max_age_s: float | None = None) -> Any: ...

    def latest(self, now_s: float | None = None) -> MonitorReading: ...


class ControlledEngine(Protocol):
    """What the loop turns: the real engine, and `edge sim`'s modelled one."""

    def stats(self) -> EngineStats: ...

    def apply(self, knobs: Knobs) -> None: ...

    def unload(self, timeout_s: float | None = 60.0) -> bool: ...

    @property
    def state(self) -> EngineState: ...


class SchedulerLike(Protocol):
    """The scheduler as the API and the service see it."""

    admission: Admission

    def status(self) -> dict[str, Any]: ...

    def limits(self) -> tuple[LimitHeadroom, ...]: ...

    def reasoning_budget(self, base_tokens: int | None) -> ThinkingBudget: ...  # in force now

    def start_thread(self, stop_event: threading.Event) -> threading.Thread: ...


class SchedulerLoop:
    """Owns the controller state; `tick()` is one iteration, `run_forever()` the production thread."""

    def __init__(
        self,
        monitor: MonitorLike | None,
        engine: ControlledEngine,
        clock: Clock | None = None,
        config: ControllerConfig | None = None,
        admission: Admission | None = None,
        wait: Callable[[threading.Event, float], object] | None = None,
        logger: logging.Logger = log,
        device_status: Callable[[], dict[str, Any]] | None = None,
        reasoning_budget_tokens: int | None = None,
    ) -> None:
        self.monitor = monitor
        self.reasoning_base_tokens = reasoning_budget_tokens  # --reasoning-budget (None: unlimited)
        self.thinking_shrunk_s = 0.0  # time the thinking budget was cut (scheduler/reasoning.py)
        self.thinking_min_tokens: int | None = None  # the smallest budget in force so far
        self._thinking_prev: tuple[float, bool] | None = None  # (t_s, shrunk) at the last tick
        self.device_status = device_status  # a simulated device's own account, for /v1/status
        self.log = logger  # `edge sim` passes a quieter one: it makes thousands of decisions a second
        self.engine = engine
        self.clock = clock or SystemClock()
        self.config = config or ControllerConfig()
        self.admission = admission
        self.state = ControllerState()
        self.decision: Decision | None = None
        self.reading: ControlInput | None = None
        self.throttle_events: Counter[str] = Counter()  # reason tag -> times it began
        self.knob_changes = 0
        self.ticks = 0
        self.errors = 0
        self.evictions = 0  # unloads forced by a memory emergency (keep-alive is the engine's own)
        self._warned_unavailable = False
        # energy while power was known, and the tokens generated over the same time: joules per token
        self.energy_j = 0.0
        self.energy_tokens = 0
        self._power_prev: tuple[float, float, int] | None = None  # (t_s, power_w, total tokens)
        if wait is None:
            wait = (lambda ev, t: ev.wait(t)) if isinstance(self.clock, SystemClock) else (
                lambda ev, t: self.clock.sleep(t))
        self._wait = wait

    def _read(self, now_s: float) -> ControlInput:
        if self.monitor is None:
            return ControlInput(t_s=now_s, stale=True)
        try:
            capped = self.decision is not None and self.decision.threads_cap is not None
            # while capped, each tick reads the cores afresh: the threads come back within a second
            # of a neighbour's end only if the rates cover the last quarter second, not the last one
            self.monitor.poll(now_s, max_age_s=CAPPED_INTERVAL_S * 0.8 if capped else None)
            reading = self.monitor.latest(now_s)  # the loop's time, not whatever clock the monitor has
        except Exception as exc:  # a broken sensor stack must not stop scheduling
            self.log.warning("telemetry failed: %s", exc)
            self.errors += 1
            return ControlInput(t_s=now_s, stale=True)
        if reading is None:
            return ControlInput(t_s=now_s, stale=True)
        inp = ControlInput.from_reading(reading)
        return inp if inp.t_s else replace(inp, t_s=now_s)

    def _stats(self) -> EngineStats | None:
        try:
            return self.engine.stats()
        except Exception as exc:
            self.log.warning("engine stats failed: %s", exc)
            self.errors += 1
            return None

    def _queue(self, stats: EngineStats | None) -> QueueState:
        if self.admission is not None:
            return self.admission.queue_state()
        if stats is None:
            return QueueState()
        return QueueState(
            waiting_interactive=stats.waiting_interactive,
            waiting_background=stats.waiting - stats.waiting_interactive,
            running_interactive=stats.active + stats.parked,
        )

    def tick(self, now_s: float | None = None) -> Decision:
        """Poll, decide, apply; returns the decision."""
        now_s = self.clock.monotonic() if now_s is None else now_s
        inp = self._read(now_s)
        stats = self._stats()
        if stats is not None and stats.loading_bytes and inp.mem_available_bytes is not None:
            # a model host's load in flight: its bytes are spoken for, though not taken yet
            inp = replace(inp, mem_available_bytes=max(0, inp.mem_available_bytes - stats.loading_bytes))
        decision, self.state = decide(inp, self._queue(stats), stats, self.state, self.config)
        prev = self.decision
        if prev is None or decision.knobs != prev.knobs:
            try:
                self.engine.apply(decision.knobs)
                self.knob_changes += 1
            except Exception as exc:
                self.log.error("engine.apply failed: %s", exc)
                self.errors += 1
        if prev is None or decision.mode != prev.mode or decision.knobs != prev.knobs \
                or decision.memory != prev.memory:
            self.log.info("scheduler %s/%s: %s", decision.mode.value, decision.memory.value, decision.reason)
        if decision.mode is ThermalMode.UNAVAILABLE and not self._warned_unavailable:
            self._warned_unavailable = True
            source = self.monitor.source.name if self.monitor is not None else "none"
            self.log.warning(
                "thermal control UNAVAILABLE: telemetry %s exposes no thermal sensor and no OS thermal "
                "signal, so edge cannot see heat and will not throttle for it (the memory guard still "
                "works). To use thermal control, run where /sys/class/thermal or hwmon sensors are "
                "exposed (e.g. not in a container), or try it on a simulated device with "
                "--telemetry sim:PROFILE[@SCALE]", source)
        before = set(prev.throttle_reasons) if prev is not None else set()
        for tag in decision.throttle_reasons:
            if tag not in before:
                self.throttle_events[tag] += 1
        if self.admission is not None:  # shed first: an engine with work refuses to unload
            for ticket in self.admission.update(decision, inp.mem_available_bytes):
                self.log.warning("shed %s ticket %d: %s", ticket.priority.name.lower(), ticket.ticket_id,
                            decision.reason)
        if decision.unload:
            self._unload(decision)
        self._account_energy(now_s, inp, stats)
        self.decision, self.reading = decision, inp
        self._note_thinking(now_s)
        self.ticks += 1
        return decision

    def reasoning_budget(self, base_tokens: int | None) -> ThinkingBudget:
        """The thinking budget in force under the last decision, from the configured `base_tokens`
        (None or -1: unlimited)."""
        return thinking_budget(base_tokens, self.decision)

    def _note_thinking(self, now_s: float) -> None:
        """How long the thinking budget has been cut, and its smallest value (status, `edge sim`)."""
        b = self.reasoning_budget(self.reasoning_base_tokens)
        if self._thinking_prev is not None and self._thinking_prev[1]:
            self.thinking_shrunk_s += max(0.0, now_s - self._thinking_prev[0])
        self._thinking_prev = (now_s, b.shrunk)
        if b.tokens is not None and (self.thinking_min_tokens is None or b.tokens < self.thinking_min_tokens):
            self.thinking_min_tokens = b.tokens

    def thinking_status(self) -> dict[str, Any]:
        """The budget in force and why, with the time it was cut and its smallest value."""
        now = self.reasoning_budget(self.reasoning_base_tokens)
        return {**now.as_dict(), "shrunk_s": round(self.thinking_shrunk_s, 1),
                "min_tokens": self.thinking_min_tokens}

    def _account_energy(self, now_s: float, inp: ControlInput, stats: EngineStats | None) -> None:
        """Integrate power over the time it was known (left rectangle); count the tokens alongside."""
        if inp.power_w is None or inp.power_stale or stats is None:
            self._power_prev = None
            return
        prev = self._power_prev
        if prev is not None and now_s > prev[0]:
            self.energy_j += prev[1] * (now_s - prev[0])
            self.energy_tokens += max(0, stats.total_tokens_decoded - prev[2])
        self._power_prev = (now_s, inp.power_w, stats.total_tokens_decoded)

    def _unload(self, decision: Decision) -> None:
        """Free the model under a memory emergency; the engine reloads on the next request.
        (Keep-alive unloading after idle time is the engine's own, on the engine's clock.)"""
        if self.engine.state in (EngineState.UNLOADED, EngineState.LOADING):
            return
        try:
            if self.engine.unload():  # False when the engine has work: decided again next tick
                self.evictions += 1
                self.log.warning("model unloaded to give memory back: %s", decision.reason)
        except Exception as exc:
            self.log.error("engine.unload failed: %s", exc)
            self.errors += 1

    def interval_s(self) -> float:
        d = self.decision
        if d is not None and d.threads_cap is not None:
            return CAPPED_INTERVAL_S
        return INTERVAL_S if d is None or d.mode is ThermalMode.NOMINAL else FAST_INTERVAL_S

    def run_forever(self, stop_event: threading.Event) -> None:
        """Production loop (run it in a thread); exceptions in one tick are logged, not fatal."""
        while not stop_event.is_set():
            try:
                self.tick()
            except Exception:
                self.log.exception("scheduler tick failed")
                self.errors += 1
            self._wait(stop_event, self.interval_s())

    def start_thread(self, stop_event: threading.Event) -> threading.Thread:
        thread = threading.Thread(target=self.run_forever, args=(stop_event,), name="edge-scheduler",
                                  daemon=True)
        thread.start()
        return thread

    def limits(self) -> tuple[LimitHeadroom, ...]:
        """Headroom to each limit under the last decision (none before the first tick)."""
        d = self.decision
        return () if d is None else limits_of(d, self.config)

    def status(self) -> dict[str, Any]:
        """The last decision and counters, for /v1/status and /metrics."""
        r, d = self.reading, self.decision
        mode = None if d is None else d.mode
        return {
            "decision": d.as_dict() if d is not None else None,
            # one gauge per mode (1 for the current one): /metrics keeps only numeric leaves
            "thermal_mode": {m.value: int(m is mode) for m in ThermalMode},
            "thermal_control_available": None if mode is None else mode is not ThermalMode.UNAVAILABLE,
            "u_sus": round(self.state.u_sus, 3),
            "integral_c_s": round(self.state.integral_c_s, 2),
            # learning time near target; under a minute, T_set sits up to learning_margin_c lower
            "u_sus_learned_s": round(self.state.learned_s, 1),
            "temp_c": None if r is None else r.temp_c,
            "cpu_contention": self._contention(r),
            "threads_cap": self.state.threads_cap,
            "slope_c_per_s": None if r is None else r.slope_c_per_s,
            "telemetry_stale": None if r is None else r.stale,
            "throttle_events": dict(self.throttle_events),
            "knob_changes": self.knob_changes,
            "ticks": self.ticks,
            "errors": self.errors,
            "evictions": self.evictions,
            "sim_device": self._sim_status(),
            "power": self._power_status(r, d),
            "reasoning_budget": self.thinking_status(),
        }

    def _power_status(self, r: ControlInput | None, d: Decision | None) -> dict[str, Any]:
        """Watts, budget, battery and energy per token; None fields are unknown."""
        p = d.power if d is not None else None
        tokens, energy = self.energy_tokens, self.energy_j
        return {
            "power_w": None if r is None or r.power_w is None else round(r.power_w, 3),
            "power_stale": None if r is None else r.power_stale,
            "budget_w": None if p is None else p.budget_w,
            "budget_origin": None if p is None else p.origin.value,
            "control": None if p is None else p.control.value,
            "headroom_w": None if p is None or p.headroom_w is None else round(p.headroom_w, 3),
            "headroom_frac": None if p is None or p.headroom_frac is None else round(p.headroom_frac, 3),
            "on_battery": None if r is None else r.on_battery,
            "battery_pct": None if r is None else r.battery_pct,
            "battery_low": None if p is None else p.battery_low,
            "energy_j": round(energy, 2),
            "energy_tokens": tokens,
            "joules_per_token": round(energy / tokens, 4) if tokens > 0 else None,
            "tokens_per_joule": round(tokens / energy, 4) if energy > 0 else None,
        }

    def _contention(self, r: ControlInput | None) -> dict[str, Any]:
        """What other processes take from edge's cores; `known` False is unknown, never "none"."""
        known = r is not None and r.cpu_other_cores is not None and r.cpu_cores is not None
        return {
            "known": known,
            "cores": None if r is None else r.cpu_cores,
            "other_cores": None if r is None else r.cpu_other_cores,
            "steal_cores": None if r is None else r.cpu_steal_cores,
            "throttled_pct": None if r is None else r.cpu_throttled_pct,
            "psi_cpu_some_avg10": None if r is None else r.psi_cpu_some_avg10,
        }

    def _sim_status(self) -> dict[str, Any] | None:
        """The simulated device's own account (`--telemetry sim:...`), else None."""
        if self.device_status is None:
            return None
        try:
            return self.device_status()
        except Exception as exc:  # informative only
            log.debug("sim status failed: %s", exc)
            return None
