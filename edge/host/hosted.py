"""A hosted model's record and a request's lease on it (guarded by `ModelHost`'s lock)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from edge.contracts.engine import Knobs
from edge.host.names import ModelRef
from edge.host.residency import ModelState, ModelView

if TYPE_CHECKING:
    from edge.host.models import ModelHost
    from edge.planner import MemoryPlan
    from edge.runtime.types import EngineLike


@dataclass
class Hosted:
    """One model the host knows, guarded by the host's lock."""

    ref: ModelRef
    pinned: bool
    keep_alive_s: float | None
    state: ModelState = ModelState.COLD
    engine: EngineLike | None = None
    plan: MemoryPlan | None = None
    leases: int = 0
    waiting: int = 0  # leases still waiting for the load
    last_used_s: float = 0.0
    loads: int = 0
    last_load_s: float = 0.0
    error: str = ""
    applied: Knobs | None = None  # the knobs last handed to its engine

    @property
    def planned_bytes(self) -> int:
        p = self.plan
        return 0 if p is None else max(0, p.total_bytes - p.reserve_bytes)

    def view(self) -> ModelView:
        return ModelView(self.ref.key, self.state, self.planned_bytes, self.leases, self.last_used_s,
                         self.pinned)


@dataclass
class Lease:
    """A request's hold on a resident model; `release()` once done (idempotent)."""

    host: ModelHost
    model: Hosted
    engine: EngineLike
    load_s: float = 0.0  # time this lease spent waiting for a load (Ollama's load_duration)
    released: bool = field(default=False, repr=False)

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.host._release(self.model)
