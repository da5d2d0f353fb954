"""From a model reference and settings to a validated file and a memory plan.

llama.cpp must never open a file we have not validated (`edge.gguf.validate_gguf`),
and never be asked for a context that does not fit (`edge.planner.plan_memory`).
The machine facts (available memory, unified or discrete memory, reserve) come
from `edge.probe` and the device profile; all are parameters for tests.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from edge.config import DeviceProfile, Settings, resolve_profile

if TYPE_CHECKING:
    from edge.gguf.info import GGUFInfo
    from edge.planner import MemoryPlan

DEFAULT_RESERVE_BYTES = 512 << 20


def _profile(settings: Settings) -> DeviceProfile | None:
    from edge.errors import ConfigError

    try:
        return resolve_profile(settings.profile, settings.sysfs_root, settings.procfs_root)
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
) -> tuple[Path, MemoryPlan]:
    """(validated path, MemoryPlan). Raises ModelNotFound, InvalidGGUF."""
    from edge.gguf import validate_gguf
    from edge.store import resolve_model

    path = resolve_model(str(model_ref), settings)
    draft = None
    if settings.speculative == "draft" and settings.draft_model:
        draft = validate_gguf(resolve_model(settings.draft_model, settings))
    plan = size_for(validate_gguf(path), settings, profile(settings), available_bytes(), draft=draft)
    return Path(path), plan


def size_for(info: GGUFInfo, settings: Settings, prof: DeviceProfile | None, available_bytes: int,
             gpu_available_bytes: int | None = None, draft: GGUFInfo | None = None) -> MemoryPlan:
    """The one settings-to-engine sizing: what the engine is built with and what `edge plan`
    prints. The reserve and GPU layers fall back to the device profile's; `draft` is the draft
    model's file (--speculative draft), planned beside the served one."""
    from edge.planner import plan_memory

    reserve = settings.memory_reserve_bytes
    if reserve is None:
        reserve = prof.memory_reserve_bytes if prof is not None else DEFAULT_RESERVE_BYTES
    gpu_layers: int | str = settings.gpu_layers
    if gpu_layers == "auto" and prof is not None:
        gpu_layers = prof.gpu_layers
    def plan_with(n_ctx: int | None, gpu_layers: int | str, flash_attn: bool) -> MemoryPlan:
        return plan_memory(
            info,
            n_ctx=n_ctx,
            n_slots=settings.slots,
            kv_type=settings.kv_type,
            gpu_layers=gpu_layers,
            available_bytes=available_bytes,
            reserve_bytes=reserve,
            unified_memory=prof.unified_memory if prof is not None else False,
            gpu_available_bytes=gpu_available_bytes,
            n_batch=settings.n_batch,
            n_ubatch=settings.n_batch,
            # the engine requests one logits row per sequence, 1 + draft_max while it speculates
            n_outputs_max=settings.slots * (1 if settings.speculative == "off" else 1 + settings.draft_max),
            draft=draft,
            flash_attn=flash_attn,
        )

    plan = plan_with(settings.n_ctx, gpu_layers, settings.flash_attn != "off")
    free = settings.flash_attn == "fastest" and settings.kv_type == "f16"
    if free and plan.fits and plan.n_gpu_layers == 0:
        # the engine may choose no flash attention (runtime/attention.py): budget its larger compute
        # buffer at the context chosen with it, if that still fits; else flash attention stays on
        without = plan_with(plan.n_ctx, 0, False)
        if without.fits:
            return replace(without, attn_free=True)
    return plan
