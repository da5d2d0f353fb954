"""The model host as `edge serve` builds it: the store's models, the budget, real engines.

The budget defaults to the memory available at start (MemAvailable, or the cgroup's limit
where that is lower: `edge.probe`) minus the reserve, the same reserve `edge plan` keeps.
Each model is planned as `edge plan` plans it, with the whole budget as its available
memory; the engines are built from those plans (`loading.config_from_plan`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from edge.config import Settings
from edge.contracts.engine import Knobs
from edge.host.loading import (
    available_bytes_now,
    config_from_plan,
    device_profile,
    plan_for,
    reserve_for,
    template_choice,
)
from edge.host.models import ModelHost
from edge.host.names import ModelNames, ModelRef

if TYPE_CHECKING:
    from edge.planner import MemoryPlan
    from edge.runtime.types import EngineLike

log = logging.getLogger("edge.host")


def _store_lister(settings: Settings) -> Callable[[], list[tuple[str, Path]]]:
    from edge.store import store_for

    store = store_for(settings)

    def listed() -> list[tuple[str, Path]]:
        return [(m.name, Path(m.path)) for m in store.list()] if store.root.is_dir() else []

    return listed


def default_budget_bytes(settings: Settings, available_bytes: Callable[[], int] = available_bytes_now) -> int:
    """What the resident models may hold together when `--memory-budget` is not given."""
    if settings.memory_budget_bytes is not None:
        return settings.memory_budget_bytes
    return max(0, available_bytes() - reserve_for(settings, device_profile(settings)))


def build_host(settings: Settings, given: Sequence[ModelRef] = (), *,
               available_bytes: Callable[[], int] = available_bytes_now,
               engine_factory: Callable[[Path, MemoryPlan, Settings], EngineLike] | None = None,
               list_store: Callable[[], list[tuple[str, Path]]] | None = None,
               preload: bool = True) -> ModelHost:
    """A host over the store (`settings.models_dir`) and the files `given` on the command line."""
    budget = default_budget_bytes(settings, available_bytes)
    reserve = reserve_for(settings, device_profile(settings))
    # the host runs embeddings models as models of their own, so no engine carries a second one
    engine_settings = settings.model_copy(update={"embedding_model": None, "keep_alive_s": None})
    template = template_choice(engine_settings)  # once per host, not per load; a bad one fails here

    def plan(path: Path, budget_bytes: int) -> MemoryPlan:
        return plan_for(path, engine_settings, available_bytes=lambda: budget_bytes + reserve)[1]

    def build(path: Path, plan: MemoryPlan) -> EngineLike:
        if engine_factory is not None:
            return engine_factory(path, plan, engine_settings)
        from edge.runtime.engine.core import Engine

        return Engine(config_from_plan(path, plan, engine_settings, template))

    names = ModelNames(list_store or _store_lister(settings), given)
    knobs = Knobs(active_limit=settings.slots, n_threads=settings.threads or max(1, os.cpu_count() or 1))
    log.info("model host: budget %d MiB for resident models (%s), %d servable", budget >> 20,
             "--memory-budget" if settings.memory_budget_bytes is not None else "available minus reserve",
             len(names.all()))
    return ModelHost(names, budget, plan=plan, build=build, n_slots=settings.slots, knobs=knobs,
                     keep_alive_s=settings.keep_alive_s, pins=settings.pin, preload=preload)


__all__ = ["build_host", "default_budget_bytes"]
