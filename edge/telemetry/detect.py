"""Pick the telemetry source `serve` will use, from `settings.telemetry`.

auto: macOS -> macos, a Jetson -> jetson, other Linux -> linux, else none.
`sim:PROFILE[@SCALE]` names the simulated RC device (built by `edge.sim.device`,
which this package never imports: `edge.service.telemetry` maps every spec to a
source); PROFILE is a name in configs/devices or a path to a profile .toml, SCALE
compresses time (sim:jetson-orin-nano@30: 30 device seconds per wall second).
`none` gives a source whose every reading is unknown, so the scheduler runs in
its conservative mode rather than believing the device is cool.
"""

from __future__ import annotations

import platform as _platform
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from edge.clock import Clock, SystemClock
from edge.errors import ConfigError
from edge.platforms import PlatformKind, detect_platform
from edge.telemetry.monitor import TelemetrySource
from edge.telemetry.sample import Sample

KINDS = ("auto", "linux", "jetson", "macos", "none")


class NullSource:
    """Telemetry switched off: every field unknown, and it says so."""

    name = "none"

    def __init__(self, clock: Clock | None = None, reason: str = "telemetry disabled") -> None:
        self.clock = clock or SystemClock()
        self.reason = reason

    def read(self) -> Sample:
        return Sample(t_s=self.clock.monotonic(), source=self.name, errors=(self.reason,))

    def close(self) -> None:
        """Nothing to release."""


@dataclass(frozen=True)
class SourceChoice:
    spec: str  # what was asked: "auto", "jetson", "sim:jetson-orin-nano", ...
    kind: str  # what it resolves to: "linux", "jetson", "macos", "sim", "none"
    profile: str | None = None  # for sim: a name in configs/devices or a .toml path
    reason: str = ""
    time_scale: float = 1.0  # for sim: device seconds per wall second


def resolve(
    spec: str,
    root: Path = Path("/"),
    sysfs_root: Path | None = None,
    procfs_root: Path | None = None,
    system: Callable[[], str] = _platform.system,
    machine: Callable[[], str] = _platform.machine,
) -> SourceChoice:
    """Which source a spec means on this machine; raises ConfigError for an unknown spec."""
    spec = spec.strip()
    if spec.startswith("sim:"):
        sim = parse_sim_spec(spec)
        return SourceChoice(spec, "sim", sim.profile, "simulated device", sim.time_scale)
    if spec not in KINDS:
        raise ConfigError(
            "telemetry", f"unknown source {spec!r}; use one of {', '.join(KINDS)} or sim:PROFILE[@SCALE]"
        )
    if spec != "auto":
        return SourceChoice(spec, spec, reason="set in settings")
    info = detect_platform(root, sysfs_root, procfs_root, system, machine)
    if info.kind in (PlatformKind.APPLE_SILICON, PlatformKind.MACOS_INTEL):
        return SourceChoice(spec, "macos", reason="macOS")
    if info.kind is PlatformKind.JETSON:
        return SourceChoice(spec, "jetson", reason=f"Jetson ({info.model or info.l4t_release})")
    if info.system == "Linux":
        board = "" if info.kind is PlatformKind.LINUX else f" ({info.model or info.kind.value})"
        return SourceChoice(spec, "linux", reason=f"Linux{board}")
    return SourceChoice(spec, "none", reason=f"no telemetry for {info.system}")


def make_source(
    spec: str = "auto",
    sysfs_root: Path = Path("/sys"),
    procfs_root: Path = Path("/proc"),
    clock: Clock | None = None,
    root: Path = Path("/"),
    system: Callable[[], str] = _platform.system,
    machine: Callable[[], str] = _platform.machine,
) -> TelemetrySource:
    """Build the hardware source for `spec` (settings.telemetry); `sim:` specs are not sensors.

    Raises ConfigError for a `sim:` spec: `edge.service.telemetry.build_source` handles every spec.
    """
    choice = resolve(spec, root, sysfs_root, procfs_root, system, machine)
    if choice.kind == "sim":
        raise ConfigError("telemetry", "a sim: spec names the simulated device, not a sensor source")
    if choice.kind == "jetson":
        from edge.telemetry.jetson import JetsonSource

        return JetsonSource(sysfs_root, procfs_root, clock)
    if choice.kind == "linux":
        from edge.telemetry.linux import LinuxSource

        return LinuxSource(sysfs_root, procfs_root, clock)
    if choice.kind == "macos":
        from edge.telemetry.macos import MacOSSource

        return MacOSSource(clock=clock)
    return NullSource(clock, reason=choice.reason or "telemetry disabled")


@dataclass(frozen=True)
class SimSpec:
    """`sim:PROFILE[@SCALE]` parsed; PROFILE is a name in configs/devices or a path to a .toml file."""

    profile: str
    time_scale: float = 1.0


def parse_sim_spec(spec: str) -> SimSpec:
    """'sim:jetson-orin-nano@30' -> SimSpec('jetson-orin-nano', 30.0); raises ConfigError when malformed."""
    body = spec.strip()
    body = body[4:] if body.startswith("sim:") else body
    profile, sep, scale_text = body.rpartition("@")
    if not sep:
        profile, scale_text = body, ""
    if not profile:
        raise ConfigError("telemetry", "sim: needs a profile, e.g. sim:jetson-orin-nano@30")
    scale = 1.0
    if sep:
        try:
            scale = float(scale_text)
        except ValueError:
            raise ConfigError("telemetry", f"time scale {scale_text!r} in {spec!r} is not a number") from None
        if not 0 < scale <= 1000:
            raise ConfigError("telemetry", f"time scale in {spec!r} must be in (0, 1000]")
    return SimSpec(profile, scale)
