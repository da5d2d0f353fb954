"""Which models stay resident: the model host's decisions, pure.

A model is sized once by its memory plan (`edge plan`'s count without the reserve: weights,
KV cache, compute buffers, overhead). The resident models, and every load in flight, must fit
the memory budget together. To make room for a load, idle models go, least recently used
first; never a pinned one and never one with requests running or waiting on it. A model too
large for the whole budget is refused outright (HTTP 507) and nothing is unloaded for it.

`plan_room` answers one question, "can this model be loaded now, and what goes first?", from
typed views of the models; `ModelHost` (host/models.py) carries the answer out.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum


class ModelState(str, Enum):
    """A hosted model's life: COLD (known, nothing loaded) -> LOADING -> READY -> UNLOADING ->
    COLD; FAILED after a load that failed (the next request tries again)."""

    COLD = "cold"
    LOADING = "loading"
    READY = "ready"
    UNLOADING = "unloading"
    FAILED = "failed"

    @property
    def holds_memory(self) -> bool:
        """Counted against the budget: loaded, loading, or still freeing its memory."""
        return self in (ModelState.LOADING, ModelState.READY, ModelState.UNLOADING)


@dataclass(frozen=True)
class ModelView:
    """What the residency choice reads of one hosted model."""

    key: str
    state: ModelState
    planned_bytes: int  # the plan's count without the reserve; 0 until planned
    leases: int  # requests holding it (running, queued, or waiting for its load)
    last_used_s: float  # monotonic time of the last lease taken or given back
    pinned: bool = False

    @property
    def evictable(self) -> bool:
        return self.state is ModelState.READY and self.leases == 0 and not self.pinned


class RoomVerdict(str, Enum):
    FITS = "fits"  # load now (after unloading `evict`, if any)
    WAIT = "wait"  # fits the budget alone, but what holds the rest is busy or pinned: wait
    TOO_LARGE = "too_large"  # larger than the whole budget: refuse (507)


@dataclass(frozen=True)
class RoomPlan:
    verdict: RoomVerdict
    evict: tuple[str, ...]  # keys to unload first, least recently used first
    need_bytes: int
    budget_bytes: int
    held_bytes: int  # what resident and loading models hold now
    reason: str


def held_bytes(models: Iterable[ModelView]) -> int:
    return sum(m.planned_bytes for m in models if m.state.holds_memory)


def plan_room(models: Iterable[ModelView], key: str, need_bytes: int, budget_bytes: int) -> RoomPlan:
    """Can `key` (needing `need_bytes`) be loaded now within `budget_bytes`, and what must go first?"""
    others = [m for m in models if m.key != key]
    held = held_bytes(others)
    if need_bytes > budget_bytes:
        return RoomPlan(RoomVerdict.TOO_LARGE, (), need_bytes, budget_bytes, held,
                        f"needs {_mib(need_bytes)} MiB, the whole budget is {_mib(budget_bytes)} MiB")
    free = budget_bytes - held
    if need_bytes <= free:
        return RoomPlan(RoomVerdict.FITS, (), need_bytes, budget_bytes, held,
                        f"{_mib(need_bytes)} MiB of {_mib(free)} MiB free")
    evict: list[str] = []
    for m in sorted((m for m in others if m.evictable), key=lambda m: (m.last_used_s, m.key)):
        evict.append(m.key)
        free += m.planned_bytes
        if need_bytes <= free:
            return RoomPlan(RoomVerdict.FITS, tuple(evict), need_bytes, budget_bytes, held,
                            f"unloading {', '.join(evict)} (idle, least recently used) frees room")
    busy = sorted(m.key for m in others if m.state.holds_memory and not m.evictable)
    return RoomPlan(RoomVerdict.WAIT, (), need_bytes, budget_bytes, held,
                    f"needs {_mib(need_bytes)} MiB; {', '.join(busy) or 'loads in flight'} hold the rest "
                    "(busy, loading or pinned)")


def victim_for_memory(models: Iterable[ModelView]) -> str | None:
    """The model to unload when the device itself runs short (the scheduler's eviction): the
    least recently used idle one, pinned ones last."""
    idle = [m for m in models if m.state is ModelState.READY and m.leases == 0]
    if not idle:
        return None
    return min(idle, key=lambda m: (m.pinned, m.last_used_s, m.key)).key


def _mib(n: int) -> int:
    return round(n / 2**20)
