"""Power telemetry from sysfs: INA3221 rails, hwmon power, power supplies (AC, battery), Intel RAPL.

Every reader takes the sysfs root and a `ReadLog`, like the thermal readers, so
tests run on fake trees and one failing file does not hide the others.

Which reading is the device's power (`PowerReading.power_w`), first that exists:
1. an INA3221 total rail (VDD_IN, VIN, POM_5V_IN: the module's input), else the sum of
   every INA3221 rail (AGX Orin's monitors sit on the sub-rails, as jtop sums them);
2. a battery that is discharging: its `power_now` (or current x voltage) is the whole
   machine's draw, which is what a battery budget is about;
3. hwmon `power*_input` (µW: e.g. a board's input monitor, amdgpu, some ARM SoCs), summed;
4. Intel RAPL package domains (`intel-rapl:N/energy_uj`): watts from the energy delta
   between two reads over the injected clock, wraparound via `max_energy_range_uj`.
   RAPL measures the CPU package, not the wall: better than nothing under a budget.
Missing inputs are listed in `absent` (for `edge doctor`), never guessed at.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from edge.telemetry.readlog import ReadLog, numbered
from edge.telemetry.sample import PowerRail

# Rails that measure the whole module's input (Orin Nano/NX, Xavier NX, TX2 NX; Nano 4 GB: POM_5V_IN).
TOTAL_RAILS = ("VDD_IN", "VIN", "POM_5V_IN")
_AC_TYPES = ("mains", "usb", "usb_c", "usb_pd", "usb_dcp", "usb_cdp", "usb_aca", "wireless")


def read_ina3221(sysfs_root: Path, log: ReadLog) -> list[PowerRail]:
    """Every labelled INA3221 channel, from both driver layouts.

    hwmon (L4T 34+, upstream): `drivers/ina3221*/DEV/hwmon/hwmonN/in{N}_label`, `in{N}_input` mV,
    `curr{N}_input` mA. iio (JetPack 4, driver `ina3221x`): `DEV/iio:deviceN/rail_name_{K}`,
    `in_voltage{K}_input` mV, `in_current{K}_input` mA, `in_power{K}_input` mW.
    """
    rails: list[PowerRail] = []
    drivers = sysfs_root / "bus" / "i2c" / "drivers"
    try:
        bases = sorted(d for d in drivers.glob("ina3221*") if d.is_dir())
    except OSError:
        return rails
    for base in bases:
        for hdir in sorted(base.glob("*/hwmon/hwmon*")):
            for label_path in sorted(hdir.glob("in*_label")):
                ch = label_path.name[2 : -len("_label")]
                label = log.text(label_path, static=True)
                if not label or label.upper() == "NC":  # "NC": channel not connected
                    continue
                volts = log.milli(hdir / f"in{ch}_input")
                amps = log.milli(hdir / f"curr{ch}_input")
                watts = volts * amps if volts is not None and amps is not None else None
                rails.append(PowerRail(label, watts, volts, amps))
        for idir in sorted(base.glob("*/iio:device*")):
            for name_path in sorted(idir.glob("rail_name_*")):
                ch = name_path.name[len("rail_name_") :]
                label = log.text(name_path, static=True)
                if not label or label.upper() == "NC":
                    continue
                watts = log.milli(idir / f"in_power{ch}_input")
                volts = log.milli(idir / f"in_voltage{ch}_input", required=False)
                amps = log.milli(idir / f"in_current{ch}_input", required=False)
                rails.append(PowerRail(label, watts, volts, amps))
    return rails


def total_power_w(rails: list[PowerRail]) -> float | None:
    """The module input rail when there is one; else the sum of every measured rail (None if any failed)."""
    by_name = {r.name.upper(): r for r in rails}
    for name in TOTAL_RAILS:
        if name in by_name:
            return by_name[name].power_w
    watts = [r.power_w for r in rails]
    return sum(w for w in watts if w is not None) if watts and None not in watts else None


def read_hwmon_power(sysfs_root: Path, log: ReadLog) -> list[PowerRail]:
    """hwmon `power*_input` (µW) of every chip but INA3221 (read above, in its own units)."""
    rails: list[PowerRail] = []
    for hdir in numbered(sysfs_root / "class" / "hwmon", "hwmon"):
        chip = log.text(hdir / "name", required=False, static=True) or hdir.name
        if chip.lower().startswith("ina3221"):
            continue
        try:
            inputs = sorted(hdir.glob("power*_input"))
        except OSError:
            continue
        for inp in inputs:
            stem = inp.name[: -len("_input")]
            micro = log.integer(inp)
            label = log.text(hdir / f"{stem}_label", required=False, static=True) or stem
            rails.append(PowerRail(f"{chip}:{label}", None if micro is None else micro / 1e6))
    return rails


@dataclass(frozen=True)
class PowerSupply:
    """One /sys/class/power_supply entry."""

    name: str
    type: str  # Battery, Mains, USB, ...
    online: bool | None = None  # AC adapters: plugged in
    status: str | None = None  # batteries: Charging, Discharging, Full, Not charging, Unknown
    capacity_pct: float | None = None
    power_w: float | None = None  # power_now, else current_now x voltage_now

    @property
    def is_battery(self) -> bool:
        return self.type.lower() == "battery"

    @property
    def is_ac(self) -> bool:
        return self.type.lower() in _AC_TYPES


def read_power_supplies(sysfs_root: Path, log: ReadLog) -> list[PowerSupply]:
    supplies: list[PowerSupply] = []
    base = sysfs_root / "class" / "power_supply"
    try:
        entries = sorted(p for p in base.iterdir()) if base.is_dir() else []
    except OSError:
        return supplies
    for sdir in entries:
        kind = log.text(sdir / "type", required=False, static=True) or "Unknown"
        if kind.lower() == "battery" and (log.text(sdir / "scope", required=False, static=True) or "") \
                .lower() == "device":
            continue  # a mouse's or a pen's battery, not the machine's
        online = log.integer(sdir / "online", required=False)
        status = log.text(sdir / "status", required=False)
        capacity = log.integer(sdir / "capacity", required=False)
        if capacity is not None and not 0 <= capacity <= 100:
            log.note(f"{sdir / 'capacity'}: implausible {capacity}%")
            capacity = None
        power_w: float | None = None
        if kind.lower() == "battery":
            micro_w = log.integer(sdir / "power_now", required=False)
            if micro_w is not None:
                power_w = abs(micro_w) / 1e6
            else:
                ua = log.integer(sdir / "current_now", required=False)
                uv = log.integer(sdir / "voltage_now", required=False)
                if ua is not None and uv is not None:
                    power_w = abs(ua) * uv / 1e12
        supplies.append(PowerSupply(sdir.name, kind, None if online is None else online > 0, status,
                                    None if capacity is None else float(capacity), power_w))
    return supplies


def on_battery(supplies: list[PowerSupply]) -> bool | None:
    """True when the machine runs from its battery; None when it cannot tell (no supply at all)."""
    acs = [s for s in supplies if s.is_ac and s.online is not None]
    batteries = [s for s in supplies if s.is_battery]
    if any(s.online for s in acs):
        return False
    if any((s.status or "").lower() == "discharging" for s in batteries):
        return True
    if acs and batteries:
        return True  # every adapter offline, a battery present
    if batteries and any((s.status or "").lower() in ("charging", "full") for s in batteries):
        return False
    return None


def battery_pct(supplies: list[PowerSupply]) -> float | None:
    caps = [s.capacity_pct for s in supplies if s.is_battery and s.capacity_pct is not None]
    return min(caps) if caps else None


_RAPL_PACKAGE = re.compile(r"^intel-rapl:\d+$")


class RaplMeter:
    """Watts from RAPL energy counters: the delta between two reads over the caller's clock."""

    def __init__(self) -> None:
        self._prev: dict[Path, tuple[float, int]] = {}

    def read(self, sysfs_root: Path, log: ReadLog, t_s: float) -> tuple[float | None, bool]:
        """(package watts or None until two reads, whether any RAPL domain exists)."""
        base = sysfs_root / "class" / "powercap"
        try:
            entries = base.iterdir() if base.is_dir() else iter(())
            domains = sorted(d for d in entries if _RAPL_PACKAGE.match(d.name))
        except OSError:
            return None, False
        total, known = 0.0, bool(domains)
        for d in domains:
            energy = log.integer(d / "energy_uj")
            if energy is None:
                known = False
                self._prev.pop(d, None)
                continue
            prev = self._prev.get(d)
            self._prev[d] = (t_s, energy)
            if prev is None or t_s <= prev[0]:
                known = False
                continue
            delta = energy - prev[1]
            if delta < 0:  # the counter wrapped
                wrap = log.integer(d / "max_energy_range_uj", static=True)
                if wrap is None or wrap <= 0:
                    known = False
                    continue
                delta += wrap
            total += delta / 1e6 / (t_s - prev[0])
        return (total if known else None), bool(domains)


@dataclass(frozen=True)
class PowerReading:
    """What the power inputs say now; None is unknown."""

    power_w: float | None = None
    power_source: str | None = None  # "ina3221", "battery", "hwmon", "rapl" (which fed power_w)
    rails: tuple[PowerRail, ...] = ()
    on_battery: bool | None = None
    battery_pct: float | None = None
    present: tuple[str, ...] = ()  # inputs this machine has
    absent: tuple[str, ...] = ()  # inputs looked for and not found


class PowerReader:
    """Reads every Linux power input; keeps the RAPL counters' previous values between reads."""

    INPUTS = ("ina3221", "power_supply", "hwmon_power", "rapl")

    def __init__(self, sysfs_root: Path) -> None:
        self.sysfs_root = sysfs_root
        self.rapl = RaplMeter()

    def read(self, log: ReadLog, t_s: float) -> PowerReading:
        root = self.sysfs_root
        rails = read_ina3221(root, log)
        supplies = read_power_supplies(root, log)
        hw = read_hwmon_power(root, log)
        rapl_w, has_rapl = self.rapl.read(root, log, t_s)
        present = [name for name, ok in zip(self.INPUTS, (bool(rails), bool(supplies), bool(hw), has_rapl),
                                            strict=True) if ok]
        battery = on_battery(supplies)
        watts, source = None, None
        draining = [s.power_w for s in supplies if s.is_battery and (s.status or "").lower() == "discharging"]
        hw_w = [r.power_w for r in hw]
        if rails:
            watts, source = total_power_w(rails), "ina3221"
        elif draining and None not in draining:
            watts, source = sum(w for w in draining if w is not None), "battery"
        elif hw_w and None not in hw_w:
            watts, source = sum(w for w in hw_w if w is not None), "hwmon"
        elif rapl_w is not None:
            watts, source = rapl_w, "rapl"
        return PowerReading(watts, source, tuple(rails) + tuple(hw), battery, battery_pct(supplies),
                            tuple(present), tuple(n for n in self.INPUTS if n not in present))
