"""Power modes, fans and macOS battery state: the slow-changing power facts.

* Jetson `nvpmodel -q` (run through an injected runner) names the current mode;
  `/etc/nvpmodel.conf` lists every mode (`< POWER_MODEL ID=1 NAME=7W >`). A mode named
  for its watts (15W, 7W, 25W, 10W_DESKTOP) is that power budget; MAXN modes have none.
* Fans: hwmon `pwm1` (0-255) and `fan1_input` / `rpm` (tachometer), e.g. Jetson's pwm-fan;
  the profile (quiet, cool) from `/etc/nvfancontrol.conf` FAN_DEFAULT_PROFILE.
* macOS: `pmset -g batt` says AC or battery and the charge; `powermetrics` (root only)
  gives the combined CPU+GPU+ANE power.
Each call that runs a program goes through a `Runner` so tests feed it canned output,
and a missing program is a None reading with a reason, never an exception.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from edge.telemetry.readlog import ReadLog, numbered

Runner = Callable[[Sequence[str]], str]  # argv -> stdout; raises OSError / CalledProcessError / Timeout


def run_command(argv: Sequence[str], timeout_s: float = 3.0) -> str:
    """Production runner: a short command's stdout. A tool not on PATH (nvpmodel off a Jetson)
    fails without a child process: serve's deployment record asks after the model has loaded,
    and a fork of a server holding the weights shows twice its memory to whoever sums RSS."""
    if shutil.which(argv[0]) is None:
        raise FileNotFoundError(argv[0])
    return subprocess.run(list(argv), capture_output=True, text=True, check=True, timeout=timeout_s).stdout


def run_or_reason(runner: Runner, argv: Sequence[str]) -> tuple[str | None, str | None]:
    """(stdout, None) or (None, why it could not run)."""
    try:
        return runner(argv), None
    except FileNotFoundError:
        return None, f"{argv[0]} not found"
    except subprocess.CalledProcessError as exc:
        return None, f"{' '.join(argv)} exited {exc.returncode}"
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"{' '.join(argv)}: {type(exc).__name__}: {exc}"


# --- nvpmodel ------------------------------------------------------------------------------

_MODE_LINE = re.compile(r"<\s*POWER_MODEL\s+ID=(\d+)\s+NAME=([^\s>]+)\s*>")
_WATTS = re.compile(r"(\d+(?:\.\d+)?)\s*W(?![A-Za-z])", re.IGNORECASE)


@dataclass(frozen=True)
class PowerMode:
    mode_id: int | None
    name: str | None
    budget_w: float | None  # None: no budget in the name (MAXN) or unknown


def budget_from_name(name: str) -> float | None:
    """'15W' -> 15.0, '7W' -> 7.0, '10W_DESKTOP' -> 10.0, 'MAXN' / 'MAXN_SUPER' -> None."""
    m = _WATTS.search(name.replace("_", " "))
    return float(m.group(1)) if m else None


def parse_nvpmodel_conf(text: str) -> dict[int, str]:
    """Mode id -> name from /etc/nvpmodel.conf."""
    return {int(m.group(1)): m.group(2) for m in _MODE_LINE.finditer(text)}


def parse_nvpmodel_query(text: str) -> tuple[str | None, int | None]:
    """`nvpmodel -q` prints 'NV Power Mode: 15W' and then the id on its own line."""
    name, mode_id = None, None
    for line in text.splitlines():
        line = line.strip()
        if line.lower().startswith("nv power mode:"):
            name = line.split(":", 1)[1].strip() or None
        elif line.isdigit() and mode_id is None:
            mode_id = int(line)
    return name, mode_id


def read_power_mode(runner: Runner, conf_path: Path, log: ReadLog) -> PowerMode | None:
    """The current nvpmodel mode and its budget; None when this is not a Jetson with nvpmodel."""
    out, why = run_or_reason(runner, ["nvpmodel", "-q"])
    conf_text = log.text(conf_path, required=False, static=True)
    modes = parse_nvpmodel_conf(conf_text) if conf_text else {}
    if out is None:
        if modes:
            log.note(f"nvpmodel: {why}")
        return None
    name, mode_id = parse_nvpmodel_query(out)
    if name is None and mode_id is not None:
        name = modes.get(mode_id)
    if name is None:
        log.note(f"nvpmodel -q: unparsable {out[:60]!r}")
        return PowerMode(mode_id, None, None)
    return PowerMode(mode_id, name, budget_from_name(name))


# --- fans ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fan:
    name: str  # hwmon chip name, e.g. "pwmfan"
    pwm: int | None  # 0..255
    rpm: int | None

    @property
    def duty_pct(self) -> float | None:
        return None if self.pwm is None else round(100.0 * self.pwm / 255.0, 1)


def read_fans(sysfs_root: Path, log: ReadLog) -> list[Fan]:
    fans: list[Fan] = []
    for hdir in numbered(sysfs_root / "class" / "hwmon", "hwmon"):
        has_pwm, has_rpm = (hdir / "pwm1").exists(), (hdir / "fan1_input").exists() or (hdir / "rpm").exists()
        if not (has_pwm or has_rpm):
            continue
        chip = log.text(hdir / "name", required=False, static=True) or hdir.name
        pwm = log.integer(hdir / "pwm1") if has_pwm else None
        rpm_path = hdir / "fan1_input" if (hdir / "fan1_input").exists() else hdir / "rpm"
        rpm = log.integer(rpm_path) if has_rpm else None
        fans.append(Fan(chip, pwm, rpm))
    return fans


def read_fan_profile(etc_root: Path, log: ReadLog) -> str | None:
    """FAN_DEFAULT_PROFILE from /etc/nvfancontrol.conf (Jetson), else None."""
    text = log.text(etc_root / "nvfancontrol.conf", required=False, static=True)
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "FAN_DEFAULT_PROFILE":
            return parts[1]
    return None


# --- macOS ---------------------------------------------------------------------------------

_PMSET_PCT = re.compile(r"(\d{1,3})%")


@dataclass(frozen=True)
class MacPower:
    on_battery: bool | None
    battery_pct: float | None
    power_w: float | None = None  # powermetrics, when allowed


def parse_pmset_batt(text: str) -> tuple[bool | None, float | None]:
    """`Now drawing from 'Battery Power'` / `'AC Power'`, then ` -InternalBattery-0 ... 85%; ...`."""
    on_batt: bool | None = None
    if "'Battery Power'" in text:
        on_batt = True
    elif "'AC Power'" in text or "'UPS Power'" in text:
        on_batt = False
    pct = None
    for line in text.splitlines():
        if "InternalBattery" in line:
            m = _PMSET_PCT.search(line)
            if m and 0 <= int(m.group(1)) <= 100:
                pct = float(m.group(1))
            break
    return on_batt, pct


_COMBINED = re.compile(r"Combined Power \(CPU \+ GPU \+ ANE\):\s*(\d+(?:\.\d+)?)\s*mW")
_PACKAGE = re.compile(r"(?:Package|CPU) Power:\s*(\d+(?:\.\d+)?)\s*mW")


def parse_powermetrics(text: str) -> float | None:
    """Watts from one `powermetrics --samplers cpu_power` sample (combined, else package/CPU)."""
    m = _COMBINED.search(text) or _PACKAGE.search(text)
    return float(m.group(1)) / 1000.0 if m else None


def read_mac_power(runner: Runner, use_powermetrics: bool = False) -> tuple[MacPower, list[str]]:
    notes: list[str] = []
    out, why = run_or_reason(runner, ["pmset", "-g", "batt"])
    on_batt, pct = parse_pmset_batt(out) if out is not None else (None, None)
    if why:
        notes.append(f"pmset: {why}")
    watts = None
    if use_powermetrics:
        pm, why = run_or_reason(runner, ["powermetrics", "-n", "1", "-i", "500", "--samplers", "cpu_power"])
        watts = parse_powermetrics(pm) if pm is not None else None
        if why:
            notes.append(f"powermetrics: {why}")
    return MacPower(on_batt, pct, watts), notes
