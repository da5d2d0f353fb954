"""From a model reference and settings to a validated file, a memory plan and an engine.

llama.cpp must never open a file we have not validated (`edge.gguf.validate_gguf`),
and never be asked for a context that does not fit (`edge.planner.plan_memory`).
The machine facts (available memory, unified or discrete memory, reserve) come
from `edge.probe` and the device profile; all are parameters for tests.

This is the one place settings become an `EngineConfig`: the runtime below reads no
settings, store, planner or probe, so every engine (served, run, benchmarked) is sized here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from edge.config import DeviceProfile, Settings, resolve_profile
from edge.contracts.options import DEFAULT_CTX_PER_SLOT
from edge.errors import InsufficientMemory
from edge.runtime.engine.config import EngineConfig

if TYPE_CHECKING:
    from edge.gguf.info import GGUFInfo
    from edge.planner import MemoryPlan
    from edge.runtime.engine.core import Engine
    from edge.runtime.text.chat_template import TemplateChoice

DEFAULT_RESERVE_BYTES = 512 << 20


def device_profile(settings: Settings) -> DeviceProfile | None:
    """The device profile the settings name (or detect); None where it cannot be resolved."""
    from edge.errors import ConfigError

    try:
        return resolve_profile(settings.profile, settings.sysfs_root, settings.procfs_root)
    except ConfigError:
        return None


def available_bytes_now() -> int:
    """Memory available now (MemAvailable, the cgroup limit), psutil where neither is readable."""
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
    available_bytes: Callable[[], int] = available_bytes_now,
    profile: Callable[[Settings], DeviceProfile | None] = device_profile,
) -> tuple[Path, MemoryPlan]:
    """(validated path, MemoryPlan). Raises ModelNotFound, InvalidGGUF."""
    from edge.gguf import validated
    from edge.store import resolve_model

    path = resolve_model(str(model_ref), settings)
    draft = None
    if settings.speculative == "draft" and settings.draft_model:
        draft = validated(resolve_model(settings.draft_model, settings))
    plan = size_for(validated(path), settings, profile(settings), available_bytes(), draft=draft)
    return Path(path), plan


def reserve_for(settings: Settings, prof: DeviceProfile | None) -> int:
    """Memory left free for the OS and other programs: the setting, else the profile's."""
    if settings.memory_reserve_bytes is not None:
        return settings.memory_reserve_bytes
    return prof.memory_reserve_bytes if prof is not None else DEFAULT_RESERVE_BYTES


def size_for(info: GGUFInfo, settings: Settings, prof: DeviceProfile | None, available_bytes: int,
             gpu_available_bytes: int | None = None, draft: GGUFInfo | None = None) -> MemoryPlan:
    """The one settings-to-engine sizing: what the engine is built with and what `edge plan`
    prints. The reserve and GPU layers fall back to the device profile's; `draft` is the draft
    model's file (--speculative draft), planned beside the served one."""
    from edge.planner import plan_memory

    reserve = reserve_for(settings, prof)
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
            n_ctx_max=DEFAULT_CTX_PER_SLOT * settings.slots,
        )

    plan = plan_with(settings.n_ctx, gpu_layers, settings.flash_attn != "off")
    free = settings.flash_attn == "fastest" and settings.kv_type == "f16"
    if free and plan.fits and plan.n_gpu_layers == 0:
        # the engine may choose no flash attention (runtime/llama/attention.py): budget its larger compute
        # buffer at the context chosen with it, if that still fits; else flash attention stays on
        without = plan_with(plan.n_ctx, 0, False)
        if without.fits:
            return replace(without, attn_free=True)
    return plan


def template_choice(settings: Settings) -> TemplateChoice | None:
    """The `chat_template` setting resolved (None: the model's own). ConfigError for an unknown
    name, an unreadable file or a template that does not compile: commands call this when they
    read settings, so a typo fails at startup, before a model is pulled or loaded."""
    from edge.runtime.text.chat_template import resolve_chat_template

    return resolve_chat_template(settings.chat_template)


def _checked_file(ref: str, settings: Settings) -> Path:
    from edge.gguf import validated
    from edge.store import resolve_model

    path = resolve_model(ref, settings)
    validated(path)  # llama.cpp never opens a file edge has not checked
    return Path(path)


def draft_model_for(path: Path, settings: Settings) -> Path | None:
    """--speculative draft's model file, validated and checked to tokenize as `path` does
    (DraftVocabMismatch names both vocabularies); None when not drafting from a model."""
    if settings.speculative != "draft" or not settings.draft_model:
        return None
    from edge.runtime.spec.config import check_draft_files

    draft = _checked_file(settings.draft_model, settings)
    check_draft_files(path, draft)
    return draft


def engine_config(
    model_ref: str | Path,
    settings: Settings,
    available_bytes: Callable[[], int] | None = None,
) -> tuple[EngineConfig, MemoryPlan]:
    """Resolve `model_ref` (path or store name), validate it, plan memory and size an engine by
    the plan. Raises ConfigError, ModelNotFound, InvalidGGUF, InsufficientMemory,
    DraftVocabMismatch. `available_bytes` replaces the memory probe (tests, the model host's budget)."""
    template = template_choice(settings)  # a bad template fails before any file is read
    probe = {"available_bytes": available_bytes} if available_bytes is not None else {}
    path, plan = plan_for(model_ref, settings, **probe)
    if not plan.fits:
        raise InsufficientMemory(plan.total_bytes, plan.available_bytes, f"{path.name} ({plan.reason})")
    return config_from_plan(path, plan, settings, template), plan


def config_from_plan(
    path: Path, plan: MemoryPlan, settings: Settings, template: TemplateChoice | None
) -> EngineConfig:
    """The engine a fitting plan sizes: context, KV type and GPU layers from the plan, the rest
    from the settings (speculation, caches, keep-alive). `template` is `template_choice(settings)`,
    resolved by the caller before any file is read so a bad one fails first and compiles once."""
    embed = _checked_file(settings.embedding_model, settings) if settings.embedding_model else None
    # host memory for stashed prompt caches: the setting, within what the plan leaves free
    prompt_cache = min(settings.prompt_cache_mib << 20, max(0, plan.available_bytes - plan.total_bytes))
    return EngineConfig(
        model_path=path, n_ctx=plan.n_ctx, n_slots=settings.slots, n_threads=settings.threads,
        n_batch=settings.n_batch, kv_type=plan.kv_type, n_gpu_layers=plan.n_gpu_layers,
        chat_template=template, keep_alive_s=settings.keep_alive_s, embedding_model=embed,
        speculative=settings.speculative, draft_max=settings.draft_max,
        draft_model=draft_model_for(path, settings), flash_attn=settings.flash_attn,
        flash_attn_off_fits=plan.attn_free,
        prompt_cache_bytes=prompt_cache,
    )


def build_engine(
    model_ref: str | Path,
    settings: Settings,
    available_bytes: Callable[[], int] | None = None,
) -> tuple[Engine, MemoryPlan]:
    """An unstarted engine sized by its memory plan, and the plan (for /v1/status and the
    scheduler's reload footprint). Raises as `engine_config`."""
    from edge.runtime.engine.core import Engine

    config, plan = engine_config(model_ref, settings, available_bytes)
    return Engine(config), plan
