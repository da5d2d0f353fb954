"""A simulated device as a telemetry source: the physics (`edge.sim.physics`) on a clock.

Used by tests, by the `edge sim` harness, and by `edge serve --telemetry
sim:PROFILE[@SCALE]` with the real engine (the engine's load drives the heat;
SCALE compresses time, e.g. @30 runs 30 device seconds per wall second). The
source adds what a real sensor path has: seeded noise, a reading lag, a frozen
rail, a room temperature changed at run time. The device's names are re-exported
here, the import path callers have always used.
"""

from __future__ import annotations

import logging
import random
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Literal

from edge.clock import Clock, ScaledClock, SystemClock
from edge.config import load_profile
from edge.contracts.device import DeviceProfile
from edge.contracts.engine import EngineState, EngineStats
from edge.errors import ConfigError
from edge.sim.physics import DIE_R_FRACTION, DIE_TAU_S, PSI_AVG_WINDOW_S, DeviceLoad, GiB, SimulatedDevice
from edge.sim.throughput import ThroughputModel
from edge.telemetry.sample import Sample

__all__ = [
    "DIE_R_FRACTION",
    "DIE_TAU_S",
    "PSI_AVG_WINDOW_S",
    "DeviceLoad",
    "GiB",
    "LoadProvider",
    "SimulatedDevice",
    "SimulatedSource",
    "load_from_stats",
    "load_sim_profile",
    "make_source",
]

log = logging.getLogger(__name__)


LoadProvider = Callable[[], "EngineStats | DeviceLoad | None"]


def load_from_stats(stats: EngineStats) -> DeviceLoad:
    """What an engine snapshot means as device load (paused or idle engines draw idle power)."""
    k = stats.knobs
    if k.paused or stats.state is not EngineState.READY:
        return DeviceLoad(0, k.n_threads, 0.0)
    return DeviceLoad(stats.active, k.n_threads, k.duty, k.off_threads)


class SimulatedSource:
    """Telemetry source over a `SimulatedDevice` that advances with a clock.

    `time_scale` compresses time: with 30, one real second is 30 simulated
    seconds, so a server demo reaches the limit in seconds instead of minutes.
    `load_provider` (e.g. `engine.stats`) is read on every `read()` so the heat
    follows the work the engine is really doing. `edge sim` steps the physics
    itself (`steps_device=False`) and adds seeded sensor noise (`noise_c`, the
    standard deviation of a reading in C), so the shipped monitor smooths what a
    real sensor would give it. `ambient_file` (`--sim-ambient-file`) holds the room
    temperature in C and is re-read whenever it changes: `echo 60 > FILE` heats the
    box at run time (a demo of throttling, or of a balancer routing away from it).
    """

    def __init__(
        self,
        device: SimulatedDevice,
        clock: Clock | None = None,
        time_scale: float = 1.0,
        load_provider: LoadProvider | None = None,
        *,
        steps_device: bool = True,
        noise_c: float = 0.0,
        seed: int = 0,
        ambient_file: Path | None = None,
        power_noise_frac: float = 0.0,
    ) -> None:
        if time_scale <= 0:
            raise ValueError("time_scale must be positive")
        self.device = device
        self.clock = clock or SystemClock()
        self.time_scale = time_scale
        self.load_provider = load_provider
        self.steps_device = steps_device
        self.noise_c = noise_c
        self._noise = random.Random(seed)
        # sensor faults `edge sim` injects: multiplicative power noise, a reading lag, a frozen rail
        self.power_noise_frac = power_noise_frac
        self.lag_s = 0.0
        self.frozen_power_w: float | None = None
        self.frozen_fan_rpm: int | None = None
        self._lagged: deque[Sample] = deque()
        self.name = f"sim:{device.profile.name}"
        self._last_s = self.clock.monotonic()
        self.ambient_file = ambient_file
        self._ambient_stamp: tuple[int, int] | None = None  # (mtime_ns, size) last read

    def _read_ambient(self) -> None:
        """Take a new room temperature from `ambient_file` when the file changed; bad values are logged."""
        if self.ambient_file is None:
            return
        try:
            st = self.ambient_file.stat()
        except OSError:
            return  # not written yet: the profile's ambient holds
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp == self._ambient_stamp:
            return
        self._ambient_stamp = stamp
        text = ""
        try:
            text = self.ambient_file.read_text().strip()
            value = float(text)
        except (OSError, ValueError):
            log.warning("sim ambient file %s: not a temperature: %r", self.ambient_file, text[:40])
            return
        if not -50.0 <= value <= 150.0:
            log.warning("sim ambient file %s: %.1f C is outside -50..150 C; ignored",
                        self.ambient_file, value)
            return
        if value != self.device.ambient_c:
            log.info("sim ambient %.1f C -> %.1f C (%s)", self.device.ambient_c, value, self.ambient_file)
            self.device.ambient_c = value

    def set_load(self, active: int, threads: int, duty: float = 1.0) -> None:
        self.device.set_load(active, threads, duty)

    def read(self) -> Sample:
        now_s = self.clock.monotonic()
        self._read_ambient()
        if self.steps_device:
            self.device.step(max(0.0, now_s - self._last_s) * self.time_scale)
        self._last_s = now_s
        if self.load_provider is not None:
            got = self.load_provider()
            if isinstance(got, EngineStats):
                got = load_from_stats(got)
            if got is not None:
                self.device.set_load(got.active, got.threads, got.duty, got.off_threads)
        sample = self.device.sample(now_s, self.name)
        if self.noise_c > 0 and sample.temp_c is not None:
            sample = replace(sample, temp_c=sample.temp_c + self._noise.gauss(0.0, self.noise_c))
        if self.power_noise_frac > 0 and sample.power_w is not None:
            noisy = sample.power_w * (1.0 + self._noise.gauss(0.0, self.power_noise_frac))
            sample = replace(sample, power_w=round(max(0.0, noisy), 3))
        return self._faults(sample, now_s)

    def _faults(self, sample: Sample, now_s: float) -> Sample:
        if self.lag_s > 0:  # the reading describes the device `lag_s` ago
            self._lagged.append(sample)
            while len(self._lagged) > 1 and self._lagged[1].t_s <= now_s - self.lag_s:
                self._lagged.popleft()
            sample = replace(self._lagged[0], t_s=now_s)
        if self.frozen_power_w is not None:
            sample = replace(sample, power_w=self.frozen_power_w)
        fan = self.frozen_fan_rpm if self.frozen_fan_rpm is not None else self.device.fan_rpm
        return replace(sample, fan_rpm=fan)

    def status(self) -> dict[str, float | int | str]:
        """What the simulated device went through, for /v1/status and /metrics (demos, e2e tests)."""
        d = self.device
        return {
            "profile": d.profile.name,
            "time_scale": self.time_scale if not isinstance(self.clock, ScaledClock) else self.clock.scale,
            "temp_c": round(d.temp_c, 3),
            "max_temp_c": round(d.max_temp_c, 3),
            "limit_c": d.limit_c,
            "ambient_c": d.ambient_c,
            "power_w": round(d.power_w, 3),
            "utilisation": round(d.utilisation, 3),
            "hw_throttle_events": d.throttle_events,
            "hw_throttled_s": round(d.hw_throttled_s, 2),
            "near_limit_s": round(d.near_limit_s, 2),
        }

    def close(self) -> None:
        """Nothing to release; present so every telemetry source can be closed alike."""


def load_sim_profile(ref: str) -> DeviceProfile:
    """A profile name in configs/devices, or a path to a profile .toml (a custom or test device)."""
    if ref.endswith(".toml") or "/" in ref:
        path = Path(ref).expanduser()
        if not path.is_file():
            raise ConfigError("telemetry", f"no profile file {path}")
        return load_profile(path.stem, path.parent)
    return load_profile(ref)


def make_source(
    profile_name: str,
    clock: Clock | None = None,
    time_scale: float = 1.0,
    load_provider: LoadProvider | None = None,
    throughput: ThroughputModel | None = None,
    order: Literal[1, 2] = 2,
    ambient_file: Path | None = None,
) -> SimulatedSource:
    """Build the source behind `--telemetry sim:PROFILE` (a profile name or a .toml path)."""
    device = SimulatedDevice(load_sim_profile(profile_name), throughput=throughput, order=order)
    return SimulatedSource(device, clock=clock, time_scale=time_scale, load_provider=load_provider,
                           ambient_file=ambient_file)
