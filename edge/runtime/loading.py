"""From a model reference and settings to a validated file and a memory plan.

llama.cpp must never open a file we have not validated (`edge.gguf.validate_gguf`),
and never be asked for a context that does not fit (`edge.planner.plan_memory`).
The machine facts (available memory, unified or discrete memory, reserve) come
from `edge.probe` and the device profile; all are parameters for tests.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from edge.config import DeviceProfile, Settings, load_profile

DEFAULT_RESERVE_BYTES = 512 << 20


def _profile(settings: Settings) -> DeviceProfile | None:
    from edge.errors import ConfigError

    name = settings.profile
    if name is None:
        from edge.probe import detect_platform, profile_for

        name = profile_for(detect_platform())
    try:
        return load_profile(name)
    except ConfigError:
        return None


def _available_bytes() -> int:
    from edge.probe import memory_available_bytes

    avail = memory_available_bytes()
    if avail is None:
        import psutil

        avail = int(psutil.virtual_memory().available)
    return int(avail)


def plan_for(
    model_ref: str | Path,
    settings: Settings,
    *,
    available_bytes: Callable[[], int] = _available_bytes,
    profile: Callable[[Settings], DeviceProfile | None] = _profile,
) -> tuple[Path, Any]:
    """(validated path, MemoryPlan). Raises ModelNotFound, InvalidGGUF."""
    from edge.gguf import validate_gguf
    from edge.planner import plan_memory
    from edge.store import resolve_model

    path = resolve_model(str(model_ref), settings)
    info = validate_gguf(path)
    prof = profile(settings)
    reserve = settings.memory_reserve_bytes
    if reserve is None:
        reserve = prof.memory_reserve_bytes if prof is not None else DEFAULT_RESERVE_BYTES
    gpu_layers: int | str = settings.gpu_layers
    if gpu_layers == "auto" and prof is not None:
        gpu_layers = prof.gpu_layers
    plan = plan_memory(
        info,
        n_ctx=settings.n_ctx,
        n_slots=settings.slots,
        kv_type=settings.kv_type,
        gpu_layers=gpu_layers,
        available_bytes=available_bytes(),
        reserve_bytes=reserve,
        unified_memory=prof.unified_memory if prof is not None else False,
        n_batch=settings.n_batch,
        n_ubatch=settings.n_batch,
        n_outputs_max=settings.slots,  # the engine requests one logits row per sequence
    )
    return Path(path), plan
