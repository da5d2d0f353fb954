"""Jetson telemetry: the Linux readings plus Tegra zones, INA3221 power rails,
GPU load and NvMap memory.

`jtop` (jetson-stats, optional extra) is used when it imports and its service
answers, because it can read rails that need root on some L4T releases. Any
failure (ImportError, JtopException, a timeout, `ok()` turning False) falls back
to sysfs at once and retries jtop after `jtop_retry_s`. Trip points, memory and
throttling always come from sysfs: jtop does not expose them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from edge.clock import Clock
from edge.telemetry.linux import LinuxSource, plausible_c
from edge.telemetry.power import TOTAL_RAILS, read_ina3221, total_power_w
from edge.telemetry.powermode import (
    PowerMode,
    Runner,
    read_fan_profile,
    read_fans,
    read_power_mode,
    run_command,
)
from edge.telemetry.readlog import Reader, ReadLog, read_file
from edge.telemetry.sample import PowerRail, Sample, ThermalZone

__all__ = ["TOTAL_RAILS", "JetsonSource", "read_ina3221", "total_power_w"]
JTOP_SOCKET = Path("/run/jtop.sock")  # jtop.service listens here; without it jtop cannot start

# devfreq device names of Tegra GPUs (Orin: ga10b / gpu, Xavier: gv11b, TX2: gp10b).
_GPU_DEVFREQ = ("gpu", "ga10b", "gv11b", "gp10b", "gm20b")


class JtopLike(Protocol):
    """The part of `jtop.jtop` this module uses (fakes implement this)."""

    def start(self) -> None: ...

    def close(self) -> None: ...

    def ok(self) -> bool: ...

    @property
    def temperature(self) -> Mapping[str, Any]: ...

    @property
    def power(self) -> Mapping[str, Any]: ...

    @property
    def gpu(self) -> Mapping[str, Any]: ...


def default_jtop_factory() -> JtopLike:
    """Production factory; raises ImportError when jetson-stats is not installed."""
    from jtop import jtop  # optional extra: pip install 'edge[jetson]'

    return jtop(interval=1.0)  # type: ignore[no-any-return]


def read_gpu_load_pct(sysfs_root: Path, log: ReadLog) -> float | None:
    """Tegra GPU devfreq `device/load` (per mille) as percent."""
    base = sysfs_root / "class" / "devfreq"
    for ddir in sorted(base.iterdir()) if base.is_dir() else []:
        if any(tag in ddir.name.lower() for tag in _GPU_DEVFREQ):
            load = log.integer(ddir / "device" / "load", required=False)
            if load is not None:
                return load / 10.0
    return None


def _zone_temp(zones: tuple[ThermalZone, ...], *names: str) -> float | None:
    for name in names:
        for z in zones:
            if z.name == name and z.temp_c is not None:
                return z.temp_c
    return None


class JetsonSource(LinuxSource):
    """Linux sensors + Jetson extras; `source` is "jtop" while jtop supplies readings."""

    name = "jetson"

    def __init__(
        self,
        sysfs_root: Path = Path("/sys"),
        procfs_root: Path = Path("/proc"),
        clock: Clock | None = None,
        reader: Reader = read_file,
        jtop_factory: Callable[[], JtopLike] | None = default_jtop_factory,
        jtop_start_timeout_s: float = 5.0,
        jtop_retry_s: float = 60.0,
        jtop_socket: Path | None = JTOP_SOCKET,
        runner: Runner = run_command,
        etc_root: Path = Path("/etc"),
    ) -> None:
        super().__init__(sysfs_root, procfs_root, clock, reader)
        self.jtop_socket = jtop_socket  # None: do not check for the service's socket (tests)
        self.runner = runner  # runs `nvpmodel -q`
        self.etc_root = etc_root
        self._mode: PowerMode | None = None
        self._mode_t_s: float | None = None
        self.fan_profile: str | None = None
        self.jtop_factory = jtop_factory
        self.jtop_start_timeout_s = jtop_start_timeout_s
        self.jtop_retry_s = jtop_retry_s
        self._jtop: JtopLike | None = None
        self._jtop_retry_at_s: float | None = None
        self.jtop_error: str | None = None  # last reason jtop is not used

    def read(self) -> Sample:
        base = super().read()
        log = self.new_log(base.t_s)
        extra: dict[str, Any] = {}
        try:
            extra = self._from_jtop(log, base.t_s)
        except ImportError as exc:  # not installed: it will not appear later, stop trying
            self.jtop_factory = None
            self._drop_jtop(f"jetson-stats not installed ({exc})", base.t_s, log)
        except Exception as exc:  # never let jtop break telemetry
            self._drop_jtop(f"{type(exc).__name__}: {exc}", base.t_s, log)
        if not extra:
            extra = self._from_sysfs(log)
        extra.update(self._mode_and_fan(log, base.t_s))
        tj = _zone_temp(base.zones, "tj")
        if "temp_c" not in extra and tj is not None:
            extra["temp_c"] = tj  # tj is the hottest junction of the SoC: prefer it
        return dataclasses.replace(base, errors=base.errors + tuple(log.errors), **extra)

    def _from_sysfs(self, log: ReadLog) -> dict[str, Any]:
        """Rails and power come from LinuxSource's power group (INA3221 first); add the GPU load."""
        return {"gpu_load_pct": read_gpu_load_pct(self.sysfs_root, log)}

    def _mode_and_fan(self, log: ReadLog, now_s: float) -> dict[str, Any]:
        """nvpmodel mode (re-run every `static_refresh_s`: a mode change is rare) and the fan."""
        if self._mode_t_s is None or now_s - self._mode_t_s >= self.static_refresh_s:
            self._mode_t_s = now_s
            self._mode = read_power_mode(self.runner, self.etc_root / "nvpmodel.conf", log)
            self.fan_profile = read_fan_profile(self.etc_root, log)
        fans = read_fans(self.sysfs_root, log)
        out: dict[str, Any] = {}
        if self._mode is not None:
            out.update(power_mode=self._mode.name, power_mode_budget_w=self._mode.budget_w)
        if fans:
            out.update(fan_rpm=fans[0].rpm, fan_pwm=fans[0].pwm)
        return out

    # --- jtop ---

    def _start_jtop(self) -> JtopLike:
        assert self.jtop_factory is not None
        handle = self.jtop_factory()
        failure: list[BaseException] = []

        def start() -> None:
            try:
                handle.start()
            except BaseException as exc:  # re-raised in the caller's thread
                failure.append(exc)

        worker = threading.Thread(target=start, name="jtop-start", daemon=True)
        worker.start()
        worker.join(self.jtop_start_timeout_s)
        if worker.is_alive():
            raise TimeoutError(f"jtop did not start within {self.jtop_start_timeout_s:.0f} s")
        if failure:
            raise failure[0]
        return handle

    def _drop_jtop(self, reason: str, now_s: float, log: ReadLog) -> None:
        if self._jtop is not None:
            with contextlib.suppress(Exception):  # closing a broken client
                self._jtop.close()
        self._jtop = None
        self.jtop_error = reason
        self._jtop_retry_at_s = now_s + self.jtop_retry_s
        log.note(f"jtop unavailable, using sysfs: {reason}")

    def _from_jtop(self, log: ReadLog, now_s: float) -> dict[str, Any]:
        """Readings from jtop, or {} when it is off, failed, or waiting to retry."""
        if self.jtop_factory is None:
            return {}
        if self._jtop is None:
            if self._jtop_retry_at_s is not None and now_s < self._jtop_retry_at_s:
                return {}
            if self.jtop_socket is not None and not self.jtop_socket.exists():
                self._drop_jtop(f"jtop.service is not running (no {self.jtop_socket})", now_s, log)
                return {}
            self._jtop = self._start_jtop()
            self.jtop_error = None
        if not self._jtop.ok():
            self._drop_jtop("jtop.ok() is False (service stopped?)", now_s, log)
            return {}
        out: dict[str, Any] = {"source": "jtop", "power_source": "jtop"}
        temps = {
            name.lower(): float(v["temp"])
            for name, v in dict(self._jtop.temperature).items()
            if isinstance(v, Mapping) and v.get("online", True) and plausible_c(_num(v.get("temp")))
        }
        if temps:
            out["temp_c"] = temps.get("tj", max(temps.values()))
        power = dict(self._jtop.power)
        rails = tuple(
            PowerRail(
                name,
                _scaled(v.get("power"), 1e-3),
                _scaled(v.get("volt"), 1e-3),
                _scaled(v.get("curr"), 1e-3),
            )
            for name, v in dict(power.get("rail", {})).items()
            if isinstance(v, Mapping) and v.get("online", True)
        )
        if rails:
            out["rails"] = rails
        tot = power.get("tot")
        if isinstance(tot, Mapping) and _num(tot.get("power")) is not None:
            out["power_w"] = _scaled(tot.get("power"), 1e-3)
        else:
            out["power_w"] = total_power_w(list(rails))
        for gpu in dict(self._jtop.gpu).values():
            load = _num(gpu.get("status", {}).get("load")) if isinstance(gpu, Mapping) else None
            if load is not None:
                out["gpu_load_pct"] = load
                break
        return out

    def close(self) -> None:
        if self._jtop is not None:
            try:
                self._jtop.close()
            finally:
                self._jtop = None


def _num(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _scaled(value: object, factor: float) -> float | None:
    v = _num(value)
    return None if v is None else v * factor
