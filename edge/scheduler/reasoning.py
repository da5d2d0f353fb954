"""How many tokens a model may think for, given the device's state: one pure rule.

On a small model thinking can cost several times the answer's tokens, and on a battery or
a watt budget those tokens are the expensive part. So the thinking budget in force is the
configured one (`--reasoning-budget`, -1 unlimited) scaled by what the controller allows:

    factor = min over the cuts in force of
             thermal cutting stage (limiting, conservative, paused, guard): Decision.budget
             power budget cutting (PowerControl LIMITING or FAIL_CLOSED): PowerStatus.cap_load
               (a power cap makes the mode LIMITING too; that is counted once, as power)
             battery under its reserve: BATTERY_RESERVE_FACTOR
    no cut:  budget = the configured one (unlimited stays unlimited)
    cut:     base = the configured budget, or CUT_BASE_TOKENS where it is unlimited
             budget = max(min(base, FLOOR_TOKENS), floor(base * factor))

Why scale by the allowed load: at load fraction f the device decodes at about f of full
speed, so f times the tokens take as long to think as the full budget does at full speed.
An interactive answer then keeps its latency under a cut (the thinking shrinks, not the
answer's arrival), and the energy spent thinking falls with the budget. The floor keeps a
minimal plan (a model cut to no thinking at all answers worse); a budget set below it stays.
`SchedulerLoop` reports the result in /v1/status and /metrics and the API caps each request
with it (a request may ask for less, never more).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from edge.scheduler.state import Decision, PowerControl, ThermalMode

CUT_BASE_TOKENS = 1024  # an unlimited budget under a cut scales from this
FLOOR_TOKENS = 64  # a cut never leaves less than this (unless the setting is lower)
BATTERY_RESERVE_FACTOR = 0.25  # on battery under the reserve: a quarter of the thinking
CUTTING_MODES = (ThermalMode.LIMITING, ThermalMode.CONSERVATIVE, ThermalMode.PAUSED, ThermalMode.GUARD)


@dataclass(frozen=True)
class ThinkingBudget:
    """The thinking budget in force, and why."""

    tokens: int | None  # None: unlimited
    base_tokens: int | None  # the configured budget (None: unlimited)
    factor: float = 1.0  # what the cuts in force allow, 0..1 (1: none)
    reasons: tuple[str, ...] = ()  # one line per cut in force

    @property
    def shrunk(self) -> bool:
        return bool(self.reasons)

    def as_dict(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "base_tokens": self.base_tokens, "factor": round(self.factor, 3),
                "shrunk": self.shrunk, "reason": "; ".join(self.reasons) or "no cut in force"}


def cuts(d: Decision) -> list[tuple[float, str]]:
    """(load factor, why) for each cut in force under decision `d`."""
    out: list[tuple[float, str]] = []
    p = d.power
    power_cuts = p.control in (PowerControl.LIMITING, PowerControl.FAIL_CLOSED)
    # a power cap shows as LIMITING too (the lower load wins): then the cut is the power's
    # a stage that allows the full load (budget 1.0) cuts nothing, whatever its name
    if d.mode in CUTTING_MODES and d.budget < 1.0 and not (power_cuts and d.mode is ThermalMode.LIMITING):
        out.append((d.budget, f"thermal {d.mode.value}: load cut to {d.budget:.2f}"))
    cap = (p.cap_load if p.cap_load is not None else d.budget) if power_cuts else 1.0
    if cap < 1.0:
        budget = f"{p.budget_w:g} W " if p.budget_w is not None else ""
        out.append((cap, f"power budget {budget}{p.control.value}: load cut to {cap:.2f}"))
    if p.battery_low:
        pct = f"{p.battery_pct:.0f}% " if p.battery_pct is not None else ""
        out.append((BATTERY_RESERVE_FACTOR, f"battery {pct}under its reserve"))
    return out


def thinking_budget(base_tokens: int | None, decision: Decision | None) -> ThinkingBudget:
    """The rule of the module docstring; `base_tokens` None (or negative) is unlimited."""
    base = None if base_tokens is None or base_tokens < 0 else base_tokens
    found = cuts(decision) if decision is not None else []
    if not found:
        return ThinkingBudget(base, base)
    factor = min(1.0, max(0.0, min(f for f, _ in found)))
    ref = CUT_BASE_TOKENS if base is None else base
    tokens = max(min(ref, FLOOR_TOKENS), math.floor(ref * factor))
    return ThinkingBudget(tokens, base, factor, tuple(why for _, why in found))


def request_budget(in_force: ThinkingBudget, asked_tokens: int | None) -> int | None:
    """A request's cap: what it asked for, never more than the budget in force (None: no cap)."""
    if asked_tokens is None:
        return in_force.tokens
    return asked_tokens if in_force.tokens is None else min(asked_tokens, in_force.tokens)
