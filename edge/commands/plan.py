"""`edge plan MODEL [--ctx N] [--slots N] [--kv-type T] [--memory B] [--gpu-layers N|auto]`.

Answers "will this model fit here, and with how much context?" before anything
is loaded, and explains every term of the estimate.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from edge.commands._common import add_settings_args, parse_bytes, settings_from_args
from edge.commands.inspect import resolve_model_path
from edge.config import DeviceProfile, Settings, resolve_profile
from edge.errors import InvalidRequest
from edge.gguf import validate_gguf
from edge.host.loading import size_for
from edge.kvcache import KV_CACHE_TYPES, kv_type_problem
from edge.planner import MemoryPlan

T = TypeVar("T")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="plan memory for a model: context, KV cache, GPU layers")
    p.add_argument("model", help="path to a .gguf file or a pulled model name")
    # Values are parsed in run(), so a bad one is a one-line error with exit 1, like every EdgeError.
    p.add_argument("--ctx", default=None, help="context tokens (default: largest that fits)")
    p.add_argument("--slots", default=None, help="parallel sequences sharing the KV cache")
    p.add_argument("--kv-type", default=None, help=f"KV cache type: {', '.join(KV_CACHE_TYPES)}")
    p.add_argument(
        "--memory",
        default=None,
        help="memory available, e.g. 8G, 512M, 1.5GiB (default: what the machine has free)",
    )
    p.add_argument("--gpu-memory", default=None, help="free VRAM of a discrete GPU, e.g. 8G")
    p.add_argument("--gpu-layers", default=None, help="layers on the GPU, or auto")
    p.add_argument("--profile", default=None, help="device profile (configs/devices), default: detected")
    p.add_argument("--reserve", default=None, help="memory left free (default: from the profile)")
    p.add_argument("--draft-model", default=None,
                   help="plan a draft model beside it (--speculative draft): a .gguf path or store name")
    p.add_argument("--json", action="store_true", help="print stable JSON keys")
    add_settings_args(p)
    p.set_defaults(func=run)


def _opt(value: str | None, parse: Callable[[str, str], T], param: str) -> T | None:
    return None if value is None else parse(value, param)


def _positive_int(text: str, param: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise InvalidRequest(f"--{param}: not an integer: {text!r}", param) from None
    if value < 1:
        raise InvalidRequest(f"--{param}: must be at least 1, not {value}", param)
    return value


def _bytes_arg(text: str, param: str) -> int:
    try:
        return parse_bytes(text)
    except InvalidRequest as exc:
        raise InvalidRequest(f"--{param}: {exc}", param) from None


def _gpu_layers(text: str, param: str) -> int | str:
    if text == "auto":
        return "auto"
    try:
        value = int(text)
    except ValueError:
        raise InvalidRequest(f"--{param}: expected a layer count or 'auto', not {text!r}", param) from None
    if value < 0:
        raise InvalidRequest(f"--{param}: must be 0 or more, not {value}", param)
    return value


def _kv_type(text: str, param: str) -> str:
    problem = kv_type_problem(text)
    if problem is not None:
        raise InvalidRequest(f"--{param}: {problem}", param)
    return text


def _machine_available_bytes() -> int:
    try:
        from edge.probe import memory_available_bytes

        avail = memory_available_bytes()
    except ImportError:  # pragma: no cover - probe ships with edge
        avail = None
    if avail is None:
        import psutil

        avail = int(psutil.virtual_memory().available)
    return int(avail)


def build_plan(
    args: argparse.Namespace,
    settings: Settings,
    *,
    available_bytes: Callable[[], int] = _machine_available_bytes,
    profile_name: Callable[[], str] | None = None,
) -> tuple[Path, MemoryPlan]:
    """(model path, plan) from CLI flags over settings over the device profile."""
    n_ctx = _opt(args.ctx, _positive_int, "ctx")
    n_slots = _opt(args.slots, _positive_int, "slots")
    kv_type = _opt(args.kv_type, _kv_type, "kv-type")
    memory = _opt(args.memory, _bytes_arg, "memory")
    gpu_memory = _opt(args.gpu_memory, _bytes_arg, "gpu-memory")
    reserve = _opt(args.reserve, _bytes_arg, "reserve")
    gpu_layers = _opt(args.gpu_layers, _gpu_layers, "gpu-layers")
    path = resolve_model_path(args.model, args)
    info = validate_gguf(path)
    profile: DeviceProfile = resolve_profile(args.profile or settings.profile, settings.sysfs_root,
                                             settings.procfs_root, detect=profile_name)
    flags = {"n_ctx": n_ctx, "slots": n_slots, "kv_type": kv_type, "memory_reserve_bytes": reserve,
             "gpu_layers": gpu_layers}
    sized = settings.model_copy(update={k: v for k, v in flags.items() if v is not None})
    draft_ref = args.draft_model or (settings.draft_model if settings.speculative == "draft" else None)
    draft = validate_gguf(resolve_model_path(draft_ref, args)) if draft_ref else None
    if draft is not None:
        sized = sized.model_copy(update={"speculative": "draft", "draft_model": str(draft_ref)})
    plan = size_for(info, sized, profile, memory if memory is not None else available_bytes(), gpu_memory,
                    draft)
    return path, plan


def run(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    path, plan = build_plan(args, settings)
    if args.json:
        print(json.dumps(plan.to_json(), indent=2))
    else:
        print(f"plan for {path}")
        print(plan.explain())
    return 0  # "does not fit" is an answer, not an error: see fits / the last line
