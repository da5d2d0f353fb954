"""Every telemetry spec to a source, in one place: the hardware readers or the simulated device.

`edge.telemetry` reads sensors and never imports the simulator; `sim:PROFILE[@SCALE]`
is resolved there (`detect.resolve`) but built here, for `serve` and `doctor` alike.
"""

from __future__ import annotations

import platform as _platform
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from edge.clock import Clock, ScaledClock
from edge.config import Settings
from edge.sim import device as sim_device
from edge.sim.device import SimulatedSource
from edge.telemetry.detect import make_source, resolve
from edge.telemetry.monitor import TelemetrySource


@dataclass(frozen=True)
class BuiltSource:
    """A source and the clock the monitor and scheduler run on (compressed under sim@SCALE)."""

    source: TelemetrySource
    clock: Clock | None
    time_scale: float = 1.0

    @property
    def simulated(self) -> SimulatedSource | None:
        return self.source if isinstance(self.source, SimulatedSource) else None


def build_source(
    spec: str,
    sysfs_root: Path = Path("/sys"),
    procfs_root: Path = Path("/proc"),
    clock: Clock | None = None,
    root: Path = Path("/"),
    system: Callable[[], str] = _platform.system,
    machine: Callable[[], str] = _platform.machine,
    sim_ambient_file: Path | None = None,
) -> BuiltSource:
    """The source for a telemetry spec; `clock` is the wall clock (None: the system's).
    `sim_ambient_file` sets a simulated device's room temperature at run time (ignored otherwise)."""
    choice = resolve(spec, root, sysfs_root, procfs_root, system, machine)
    if choice.kind == "sim":
        assert choice.profile is not None
        scale = choice.time_scale
        sim_clock = ScaledClock(scale, clock) if scale != 1.0 else clock
        source = sim_device.make_source(choice.profile, clock=sim_clock, ambient_file=sim_ambient_file)
        return BuiltSource(source, sim_clock, scale)
    return BuiltSource(make_source(spec, sysfs_root, procfs_root, clock, root, system, machine), clock)


def source_from_settings(settings: Settings, clock: Clock | None = None) -> BuiltSource:
    """`build_source` for `settings.telemetry` and its sysfs/procfs roots."""
    return build_source(settings.telemetry, settings.sysfs_root, settings.procfs_root, clock,
                        sim_ambient_file=settings.sim_ambient_file)
