"""The power part of `edge doctor`: which power inputs exist here, what they read, the power mode, fans.

Kept apart from doctor.py so each stays readable; the keys are stable like the rest of `--json`.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from edge.clock import ManualClock
from edge.telemetry.power import PowerReader
from edge.telemetry.powermode import Runner, read_fan_profile, read_fans, read_power_mode, run_command
from edge.telemetry.readlog import Reader, ReadLog, read_file

INPUT_NAMES = {
    "ina3221": "INA3221 rails (Jetson)",
    "power_supply": "power supplies (AC adapter, battery)",
    "hwmon_power": "hwmon power sensors",
    "rapl": "Intel RAPL energy counters",
}


def power_report(root: Path, sys_root: Path, runner: Runner = run_command, reader: Reader = read_file,
                 jtop_installed: bool | None = None) -> dict[str, Any]:
    """Power inputs present and absent, one reading, nvpmodel, fans and jetson-stats' state."""
    log = ReadLog(reader)
    reading = PowerReader(sys_root).read(log, ManualClock().monotonic())
    mode = read_power_mode(runner, root / "etc" / "nvpmodel.conf", log)
    fans = read_fans(sys_root, log)
    if jtop_installed is None:
        jtop_installed = importlib.util.find_spec("jtop") is not None
    socket = root / "run" / "jtop.sock"
    if not jtop_installed:
        jtop = "jetson-stats not installed: power and temperatures come from sysfs (edge[jetson] adds it)"
    elif not socket.exists():
        jtop = f"jetson-stats installed but jtop.service is not running (no {socket}): sysfs is used"
    else:
        jtop = "jtop.service running: used for rails and temperatures, sysfs as fallback"
    return {
        "inputs_present": list(reading.present),
        "inputs_absent": list(reading.absent),
        "power_w": reading.power_w,
        "power_source": reading.power_source,
        "on_battery": reading.on_battery,
        "battery_pct": reading.battery_pct,
        "rails": [{"name": r.name, "power_w": r.power_w, "voltage_v": r.voltage_v, "current_a": r.current_a}
                  for r in reading.rails],
        "power_mode": None if mode is None else {"id": mode.mode_id, "name": mode.name,
                                                 "budget_w": mode.budget_w},
        "fans": [{"name": f.name, "pwm": f.pwm, "duty_pct": f.duty_pct, "rpm": f.rpm} for f in fans],
        "fan_profile": read_fan_profile(root / "etc", log),
        "jtop": jtop,
        "errors": list(log.errors),
    }


def render_power(p: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    present = ", ".join(INPUT_NAMES[n] for n in p["inputs_present"]) or "none"
    absent = ", ".join(INPUT_NAMES[n] for n in p["inputs_absent"]) or "none"
    lines.append(f"power      inputs: {present}; not found: {absent}")
    if not p["inputs_present"]:
        lines.append("  no power input on this machine: power budgets cannot be measured here; a budget set "
                     "with --power-budget fails closed (reduced load), without one edge runs as usual")
    if p["power_w"] is not None:
        lines.append(f"  reading  {p['power_w']:.2f} W from {p['power_source']}")
    elif p["inputs_present"]:
        why = "RAPL needs two reads" if p["inputs_present"] == ["rapl"] else "unreadable"
        lines.append(f"  reading  unknown ({why})")
    for r in p["rails"]:
        watts = "unknown" if r["power_w"] is None else f"{r['power_w']:.2f} W"
        lines.append(f"  rail     {r['name']}: {watts}")
    if p["on_battery"] is not None:
        pct = "unknown" if p["battery_pct"] is None else f"{p['battery_pct']:.0f}%"
        lines.append(f"  supply   {'on battery' if p['on_battery'] else 'on mains'}, battery {pct}")
    mode = p["power_mode"]
    if mode is None:
        lines.append("  nvpmodel not available (not a Jetson, or nvpmodel not installed)")
    else:
        budget = "no budget (MAXN)" if mode["budget_w"] is None else f"budget {mode['budget_w']:g} W"
        lines.append(f"  nvpmodel mode {mode['id']} {mode['name']}: {budget}")
    for f in p["fans"]:
        duty = "unknown" if f["duty_pct"] is None else f"{f['duty_pct']:.0f}%"
        rpm = "unknown" if f["rpm"] is None else f"{f['rpm']} rpm"
        lines.append(f"  fan      {f['name']}: pwm {duty}, {rpm}"
                     + (f", profile {p['fan_profile']}" if p["fan_profile"] else ""))
    lines.append(f"  jtop     {p['jtop']}")
    lines.extend(f"  ! {e}" for e in p["errors"])
    return lines
