"""Headroom: how far a box is from each limit, and the weight a load balancer should give it.

Pure functions of typed inputs (a scheduler Decision, its config, the queue), so
/ready, /v1/status and the HAProxy agent check (edge.service.agent) say the same
thing and every branch is tested without a server.

Thermal headroom is 1 below T_on (the controller caps nothing there) and falls
linearly with the forecast (T + horizon * slope) to 0 at the guard line
(T_lim - guard_band, where the controller pauses everything); it is never above
the controller's budget, so a box already turned down to 40 % reports at most 0.4.
A box heating up therefore gets less traffic well before it must refuse any.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from edge.scheduler.state import (
    ControllerConfig,
    Decision,
    LimitHeadroom,
    LimitKind,
    MemoryMode,
    PowerControl,
    ThermalMode,
)

MIN_WEIGHT_PCT = 1  # a ready box is never weighted 0: HAProxy shows 0 % as DRAIN and sends nothing


def _clamp01(x: float) -> float:
    return min(1.0, max(0.0, x))


def thermal_headroom(d: Decision, cfg: ControllerConfig) -> LimitHeadroom:
    """Heat: forecast against the span from T_on to the guard line, capped by the budget."""
    blocking = d.mode in (ThermalMode.PAUSED, ThermalMode.GUARD) or (
        not d.admit_interactive and d.memory is MemoryMode.OK)
    if blocking:
        return LimitHeadroom(LimitKind.THERMAL, 0.0, True, f"{d.mode.value}: {d.reason}")
    temp_h, why = 1.0, ""
    if d.forecast_c is not None and d.t_lim_c is not None:
        stop_c = d.t_lim_c - cfg.guard_band_c
        on_c = (d.t_set_c if d.t_set_c is not None else d.t_lim_c - cfg.margin_c) - cfg.on_band_c
        span_c = max(1e-6, stop_c - on_c)
        temp_h = _clamp01((stop_c - d.forecast_c) / span_c)
        why = f"forecast {d.forecast_c:.1f} C, full below {on_c:.1f} C, none at {stop_c:.1f} C"
    h = min(temp_h, _clamp01(d.budget))
    if h == d.budget and d.budget < temp_h:
        why = f"{d.mode.value} at budget {d.budget:.2f}" + (f"; {why}" if why else "")
    return LimitHeadroom(LimitKind.THERMAL, h, False, why or d.mode.value)


def memory_headroom(d: Decision) -> LimitHeadroom:
    """Memory: admission takes nothing new while TIGHT or SHED, so either blocks."""
    if d.memory is MemoryMode.OK and not d.evict:
        return LimitHeadroom(LimitKind.MEMORY, 1.0, False, "memory ok")
    return LimitHeadroom(LimitKind.MEMORY, 0.0, True, f"memory {d.memory.value}: {d.reason}")


POWER_OVER_FRAC = 1.05  # drawing this far over the budget refuses new work (/ready 503)


def power_headroom(d: Decision) -> LimitHeadroom | None:
    """Power, while a budget is in force: the budget's unused share (0 while failing closed on a
    missing reading); a box drawing more than 5 % over its budget takes no new work."""
    p = d.power
    if p.control is PowerControl.OFF:
        return None
    h = p.headroom_frac
    over = p.budget_w is not None and p.power_w is not None and p.power_w > POWER_OVER_FRAC * p.budget_w
    watts = "unknown" if p.power_w is None else f"{p.power_w:.1f} W"
    return LimitHeadroom(LimitKind.POWER, 0.0 if h is None else h, over,
                         f"power {p.control.value}: {watts} of {p.budget_w} W ({p.origin.value})")


def limits_of(d: Decision, cfg: ControllerConfig) -> tuple[LimitHeadroom, ...]:
    """Every limit of one decision: heat, memory, the power budget, then any other the controller adds."""
    power = power_headroom(d)
    return (thermal_headroom(d, cfg), memory_headroom(d), *(() if power is None else (power,)), *d.limits)


@dataclass(frozen=True)
class LoadState:
    """Requests the box holds now, against what it runs at once and lets wait."""

    running: int
    waiting: int
    n_slots: int
    max_queue: int

    @property
    def queue_full(self) -> bool:
        """True when one more interactive request would be refused with QueueFull (admission's rule)."""
        free_slots = max(0, self.n_slots - self.running)
        return self.waiting + 1 - free_slots - self.max_queue > 0


class AgentState(str, Enum):
    UP = "up"  # in rotation, at `weight_pct`
    DRAIN = "drain"  # finishing what it has, takes nothing new
    DOWN = "down"  # not ready (loading, too hot, out of memory, queue full)


@dataclass(frozen=True)
class AgentWeight:
    """The answer to the balancer: state, weight (percent of the configured weight) and why."""

    state: AgentState
    weight_pct: int
    reason: str
    factors: tuple[tuple[str, float], ...] = ()  # each headroom that went into the weight, 0..1

    def line(self, announce_ready: bool = False) -> str:
        """One line of HAProxy's agent protocol, e.g. 'up 60%', 'drain', 'down #loading model'.

        `ready` (cancels a DRAIN or MAINT the agent set before) is added while `announce_ready`:
        the server says it for a while after it starts, so a box that drained and came back
        returns to rotation, without overriding an operator's MAINT for the rest of its life.
        """
        if self.state is AgentState.DRAIN:
            return "drain"
        if self.state is AgentState.DOWN:
            return "down #" + _ascii_word(self.reason)
        return ("up ready " if announce_ready else "up ") + f"{self.weight_pct}%"


def _ascii_word(text: str) -> str:
    """The agent line is one line of ASCII: no newlines, no non-ASCII, bounded."""
    clean = text.encode("ascii", "replace").decode().replace("\n", " ").replace("\r", " ")
    return clean[:120]


def agent_weight(*, draining: bool, ready: bool, not_ready_reason: str,
                 limits: tuple[LimitHeadroom, ...], load: LoadState) -> AgentWeight:
    """The weight for this box: the tightest limit's headroom times the room in slots and queue.

    Slots and queue weigh less than the limits: HAProxy's leastconn already counts its own
    connections, so these only add what it cannot see (work sent by others, a backlog).
    All slots busy leaves 3/4 of the weight, a full queue another 1/2. Rounded to whole
    percent, at least MIN_WEIGHT_PCT while up.
    """
    if draining:
        return AgentWeight(AgentState.DRAIN, 0, "draining")
    if not ready:
        return AgentWeight(AgentState.DOWN, 0, not_ready_reason)
    factors: list[tuple[str, float, str]] = [(lim.kind.value, _clamp01(lim.headroom), lim.reason)
                                             for lim in limits]
    if load.n_slots > 0:
        free = max(0, load.n_slots - load.running)
        factors.append(("slots", 0.75 + 0.25 * free / load.n_slots,
                        f"{min(load.running, load.n_slots)} of {load.n_slots} slots busy"))
    factors.append(("queue", 1.0 - 0.5 * min(load.waiting, load.max_queue + 1) / (load.max_queue + 1),
                    f"{load.waiting} waiting of {load.max_queue}"))
    limit_h = min((f for _, f, _ in factors[: len(limits)]), default=1.0)
    product = limit_h
    for _, f, _ in factors[len(limits):]:
        product *= f
    weight = max(MIN_WEIGHT_PCT, min(100, round(100 * product)))
    name, low, why = min(factors, key=lambda x: x[1])
    reason = "full headroom" if low >= 1.0 else f"{name} {low:.2f}: {why}"
    return AgentWeight(AgentState.UP, weight, reason, tuple((n, round(f, 3)) for n, f, _ in factors))
