"""Putting the pieces together for `serve`, `run` and `chat`: model, engine, scheduler, security.

Loaders are parameters with production defaults so tests can build a server
around a scripted engine without llama.cpp.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from edge.clock import Clock
from edge.config import DeviceProfile, Settings
from edge.errors import ConfigError
from edge.runtime.types import EngineLike

if TYPE_CHECKING:
    from edge.host.models import ModelHost
    from edge.planner import MemoryPlan
    from edge.scheduler.loop import SchedulerLoop
    from edge.sim.device import SimulatedSource
    from edge.sim.throughput import ThroughputModel
    from edge.store import ModelStore
    from edge.telemetry.monitor import TelemetrySource

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelChoice:
    path: Path
    model_id: str  # what /v1/models reports
    aliases: frozenset[str] = field(default_factory=frozenset)  # other names requests may use


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and 'localhost'; a name is resolved."""
    if host in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)


def bind_api_key(settings: Settings) -> str | None:
    """The API key to enforce; refuses a non-loopback bind without one unless --insecure."""
    key = settings.resolved_api_key()
    if key is None and not is_loopback(settings.host):
        if not settings.insecure:
            raise ConfigError(
                "host",
                f"binding {settings.host} exposes the API beyond this machine; set an API key "
                "(--api-key-file FILE or EDGE_API_KEY) or pass --insecure",
            )
        log.warning(
            "serving on %s WITHOUT an API key (--insecure): anyone on the network can use it", settings.host
        )
    return key


def choose_model(
    ref: str | None,
    settings: Settings,
    out: TextIO = sys.stderr,
    store_factory: Callable[[Path], ModelStore] | None = None,
) -> ModelChoice:
    """A path or store name -> file, pulling a catalog model first when needed (with a message)."""
    if store_factory is None:
        from edge.store import ModelStore

        store_factory = ModelStore
    name = ref or settings.default_model
    candidate = Path(name).expanduser()
    if candidate.is_file():
        path = candidate.resolve()
        stem = path.name[: -len(".gguf")] if path.name.lower().endswith(".gguf") else path.name
        return ModelChoice(path, stem, frozenset({name, str(path), path.name, stem, stem.lower()}))
    store = store_factory(settings.models_dir)
    if store.path_of(name) is None and name in store.catalog:
        print(f"edge: model {name} is not in {settings.models_dir} yet; pulling it first", file=out)
    path = Path(store.ensure(name))
    stem = path.name[: -len(".gguf")] if path.name.lower().endswith(".gguf") else path.name
    return ModelChoice(path, name, frozenset({name, path.name, stem, str(path)}))


def open_engine(path: Path, settings: Settings) -> tuple[EngineLike, MemoryPlan]:
    """The real engine (validated and memory-planned; `start()` loads it) and the plan it was
    sized by, for /v1/status and the scheduler's reload footprint."""
    from edge.host.loading import build_engine

    return build_engine(path, settings)


def open_host(refs: Sequence[str | None], settings: Settings, *,
              preload: bool = True) -> tuple[ModelHost, ModelChoice]:
    """The model host `serve` runs: the store plus the models named (pulled first where they are
    catalog names not pulled yet, as `choose_model` does) and the embeddings model, all loaded at
    start by `host.start()`; and the first model named."""
    from edge.host.build import build_host
    from edge.host.names import ModelRef

    choices = [choose_model(r, settings) for r in refs]
    from edge.host.loading import draft_model_for
    from edge.runtime.llama.early import EARLY

    for ref, choice in zip(refs, choices, strict=True):  # the next start naming it loads it early
        EARLY.note_name(ref, str(choice.path))

    for c in choices:  # a draft model that cannot serve a model named is a startup error (exit 2)
        draft_model_for(c.path, settings)
    if settings.embedding_model:
        choices.append(choose_model(settings.embedding_model, settings))
    given = [ModelRef(c.model_id, c.path, c.aliases) for c in choices]
    return build_host(settings, given, preload=preload), choices[0]


def device_profile(settings: Settings) -> DeviceProfile | None:
    """settings.profile (ConfigError when unknown), else the profile that fits the detected
    platform; None if detection fails (the controller has defaults)."""
    from edge.config import resolve_profile

    if settings.profile is not None:
        return resolve_profile(settings.profile)
    try:
        return resolve_profile(None, settings.sysfs_root, settings.procfs_root)
    except Exception as exc:  # detection is best effort
        log.warning("device profile detection failed: %s", exc)
        return None


@dataclass(frozen=True)
class _Device:
    """What the scheduler watches: the telemetry source, the clock its decisions run on (time
    compressed `scale` times under sim:PROFILE@SCALE), the simulated device if any, the profile."""

    source: TelemetrySource
    clock: Clock
    scale: float
    sim: SimulatedSource | None
    profile: DeviceProfile | None


def _device(settings: Settings, engine: EngineLike,
            source_factory: Callable[[Settings], TelemetrySource] | None,
            base_clock: Clock | None) -> _Device:
    from edge.service.telemetry import BuiltSource, source_from_settings
    from edge.sim.device import SimulatedSource

    if source_factory is not None:
        built = BuiltSource(source_factory(settings), base_clock)
    else:
        built = source_from_settings(settings, clock=base_clock)
    source = built.source
    sim = source if isinstance(source, SimulatedSource) else None
    if sim is not None:
        sim.load_provider = engine.stats  # the engine's real work heats the simulated device
    profile = sim.device.profile if settings.profile is None and sim is not None else device_profile(settings)
    return _Device(source, built.clock, built.time_scale, sim, profile)


def build_scheduler(
    settings: Settings,
    engine: EngineLike,
    source_factory: Callable[[Settings], TelemetrySource] | None = None,
    base_clock: Clock | None = None,
    plan: MemoryPlan | None = None,
) -> SchedulerLoop:
    """Telemetry monitor + admission + scheduler loop sized to this engine and device.

    The controller's slot and thread ceilings come from the engine (never more than it was
    built with), the thermal limit and memory reserve from the device profile, and the model's
    reload footprint from the memory `plan` the engine was sized by (None: unknown).

    With `--telemetry sim:PROFILE[@SCALE]` the simulated device is the device: its
    profile is used unless --profile names another, its heat follows the engine's
    real load (`engine.stats`), and with SCALE the monitor and the scheduler run on
    the same compressed clock, so the controller meets the device's dynamics as on
    hardware, only faster. Durations handed to clients (Retry-After) stay in wall seconds.
    `source_factory` and `base_clock` (the wall clock) are for tests.
    """
    from edge.scheduler.admission import Admission
    from edge.scheduler.loop import SchedulerLoop
    from edge.scheduler.state import config_for_device
    from edge.telemetry.monitor import Monitor

    dev = _device(settings, engine, source_factory, base_clock)
    knobs = engine.stats().knobs
    footprint = max(0, plan.total_bytes - plan.reserve_bytes) if plan is not None else 0
    throughput = _calibration(settings, dev.sim)
    config = config_for_device(
        engine.n_slots, knobs.n_threads, dev.profile, reserve_bytes=settings.memory_reserve_bytes,
        footprint_bytes=footprint, power_budget_w=settings.power_budget_w,
        battery_reserve_pct=settings.battery_reserve_pct,
        battery_power_budget_w=settings.battery_power_budget_w,
        decode_tps=throughput.decode_table(engine.n_slots, knobs.n_threads) if throughput is not None
        else ())
    monitor = Monitor(dev.source, clock=dev.clock, profile=dev.profile)
    # admission keeps wall time (Retry-After is for clients); the scheduler compares only its own
    # clock's times (`clock`, compressed under sim:PROFILE@SCALE)
    admission = Admission(settings.max_queue, stats_provider=engine.stats, n_slots=engine.n_slots,
                          scheduled=True, clock=base_clock, reserve_bytes=config.reserve_bytes,
                          wall_s_per_decision_s=1.0 / dev.scale)
    log.info(
        "scheduler: profile %s, limit %.0f C, reserve %d MiB, %d slots, %d threads, telemetry %s%s, "
        "calibration %s",
        dev.profile.name if dev.profile is not None else "none", config.limit_c, config.reserve_bytes >> 20,
        config.n_slots, config.max_threads, settings.telemetry.strip(),
        f" (time x{dev.scale:g})" if dev.scale != 1.0 else "",
        (throughput.source if throughput is not None else None) or "none",
    )
    scale = dev.scale
    wait = None if scale == 1.0 else (lambda ev, t_s: ev.wait(t_s / scale))
    return SchedulerLoop(monitor, engine, clock=dev.clock, config=config, admission=admission, wait=wait,
                         device_status=dev.sim.status if dev.sim is not None else None,
                         reasoning_budget_tokens=settings.reasoning_budget)


def _calibration(settings: Settings, sim: SimulatedSource | None) -> ThroughputModel | None:
    """Measured decode figures for the ladder: the setting's, else a simulated device's own."""
    from edge.sim.throughput import load_throughput

    if settings.calibration:
        return load_throughput(settings.calibration)  # ConfigError (exit 2) names the missing file
    return sim.device.throughput if sim is not None else None


def start_and_wait(
    engine: EngineLike,
    timeout_s: float = 600.0,
    clock: Callable[[], float] | None = None,
    sleep: Callable[[float], None] | None = None,
) -> None:
    """Start the engine in-process (run, chat) and wait until it is READY or has failed."""
    import time

    from edge.errors import ModelLoadError
    from edge.runtime.types import EngineState

    clock = clock or time.monotonic
    sleep = sleep or time.sleep
    engine.start()
    deadline_s = clock() + timeout_s
    while engine.state is EngineState.LOADING:
        if clock() > deadline_s:
            raise ModelLoadError(engine.model_name, f"not loaded after {timeout_s:.0f} s")
        sleep(0.05)
    if engine.state is not EngineState.READY:
        raise ModelLoadError(engine.model_name, f"engine is {engine.state.value}")
