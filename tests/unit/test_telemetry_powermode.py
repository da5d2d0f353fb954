"""nvpmodel mode and budget, fans, the jtop service check, macOS pmset and powermetrics parsing."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from edge.clock import ManualClock
from edge.telemetry.jetson import JetsonSource
from edge.telemetry.powermode import (
    budget_from_name,
    parse_nvpmodel_conf,
    parse_nvpmodel_query,
    parse_pmset_batt,
    parse_powermetrics,
    read_fan_profile,
    read_fans,
    read_mac_power,
    read_power_mode,
)
from edge.telemetry.readlog import ReadLog
from tests import fakesys

NVPMODEL_CONF = """< PM_CONFIG DEFAULT=1 >
< POWER_MODEL ID=0 NAME=15W >
CPU_ONLINE CORE_0 1
< POWER_MODEL ID=1 NAME=7W >
CPU_ONLINE CORE_0 1
< POWER_MODEL ID=2 NAME=MAXN_SUPER >
"""


def canned(outputs: dict[str, str | Exception]):  # type: ignore[no-untyped-def]
    calls: list[list[str]] = []

    def runner(argv: Sequence[str]) -> str:
        calls.append(list(argv))
        out = outputs.get(argv[0], FileNotFoundError(argv[0]))
        if isinstance(out, Exception):
            raise out
        return out

    runner.calls = calls  # type: ignore[attr-defined]
    return runner


def test_budget_from_mode_names() -> None:
    assert budget_from_name("15W") == 15.0
    assert budget_from_name("7W") == 7.0
    assert budget_from_name("10W_DESKTOP") == 10.0
    assert budget_from_name("MAXN") is None and budget_from_name("MAXN_SUPER") is None


def test_parse_conf_and_query() -> None:
    assert parse_nvpmodel_conf(NVPMODEL_CONF) == {0: "15W", 1: "7W", 2: "MAXN_SUPER"}
    assert parse_nvpmodel_query("NV Power Mode: 7W\n1\n") == ("7W", 1)


def test_read_power_mode_via_runner(tmp_path: Path) -> None:
    fs = fakesys.orin_nano(tmp_path)
    conf = fs.etc("nvpmodel.conf", NVPMODEL_CONF)
    mode = read_power_mode(canned({"nvpmodel": "NV Power Mode: 7W\n1\n"}), conf, ReadLog(fs.reader))
    assert mode is not None and (mode.mode_id, mode.name, mode.budget_w) == (1, "7W", 7.0)
    # only the id printed: the name comes from the conf
    mode = read_power_mode(canned({"nvpmodel": "0\n"}), conf, ReadLog(fs.reader))
    assert mode is not None and mode.name == "15W" and mode.budget_w == 15.0


def test_nvpmodel_missing_is_none_and_failure_is_noted(tmp_path: Path) -> None:
    fs = fakesys.orin_nano(tmp_path)
    log = ReadLog(fs.reader)
    assert read_power_mode(canned({}), fs.root / "etc/nvpmodel.conf", log) is None
    assert log.errors == []  # not a Jetson with nvpmodel: nothing to report
    conf = fs.etc("nvpmodel.conf", NVPMODEL_CONF)
    err = subprocess.CalledProcessError(1, ["nvpmodel", "-q"])
    assert read_power_mode(canned({"nvpmodel": err}), conf, log) is None
    assert any("nvpmodel -q exited 1" in e for e in log.errors)


def test_fans_and_profile(tmp_path: Path) -> None:
    fs = fakesys.orin_nano(tmp_path)
    fs.fan("pwmfan", 128, 2300)
    fs.etc("nvfancontrol.conf", "FAN_DEFAULT_CONTROL close_loop\nFAN_DEFAULT_PROFILE quiet\n")
    log = ReadLog(fs.reader)
    (fan,) = read_fans(fs.sys, log)
    assert (fan.name, fan.pwm, fan.rpm, fan.duty_pct) == ("pwmfan", 128, 2300, 50.2)
    assert read_fan_profile(fs.root / "etc", log) == "quiet"


def test_jetson_source_reports_mode_fan_and_skips_jtop_without_its_socket(tmp_path: Path) -> None:
    fs = fakesys.orin_nano(tmp_path)
    fs.etc("nvpmodel.conf", NVPMODEL_CONF)
    fs.fan("pwmfan", 200, 4100)
    runner = canned({"nvpmodel": "NV Power Mode: 7W\n1\n"})
    started: list[int] = []

    def factory():  # type: ignore[no-untyped-def]
        started.append(1)
        raise AssertionError("jtop must not start without its service")

    src = JetsonSource(fs.sys, fs.proc, ManualClock(), reader=fs.reader, jtop_factory=factory,
                       jtop_socket=fs.root / "run/jtop.sock", runner=runner, etc_root=fs.root / "etc")
    s = src.read()
    assert started == [] and s.source == "jetson"
    assert src.jtop_error is not None and "jtop.service is not running" in src.jtop_error
    assert s.power_mode == "7W" and s.power_mode_budget_w == 7.0
    assert (s.fan_pwm, s.fan_rpm) == (200, 4100)
    assert s.power_w == pytest.approx(5.056 * 1.48)
    src.read()
    assert len(runner.calls) == 1  # nvpmodel is not run on every sample


PMSET_BATT = """Now drawing from 'Battery Power'
 -InternalBattery-0 (id=4653155)\t85%; discharging; 4:12 remaining present: true
"""
PMSET_AC = """Now drawing from 'AC Power'
 -InternalBattery-0 (id=4653155)\t100%; charged; 0:00 remaining present: true
"""


def test_pmset_parsing() -> None:
    assert parse_pmset_batt(PMSET_BATT) == (True, 85.0)
    assert parse_pmset_batt(PMSET_AC) == (False, 100.0)
    assert parse_pmset_batt("Now drawing from 'AC Power'\n") == (False, None)  # a Mac mini
    assert parse_pmset_batt("garbage") == (None, None)


def test_powermetrics_parsing_and_mac_power() -> None:
    text = "**** Processor usage ****\nCPU Power: 812 mW\nGPU Power: 40 mW\n" \
           "Combined Power (CPU + GPU + ANE): 900 mW\n"
    assert parse_powermetrics(text) == pytest.approx(0.9)
    assert parse_powermetrics("CPU Power: 812 mW") == pytest.approx(0.812)
    assert parse_powermetrics("nothing") is None
    mp, notes = read_mac_power(canned({"pmset": PMSET_BATT}))
    assert (mp.on_battery, mp.battery_pct, mp.power_w) == (True, 85.0, None) and notes == []
    denied = subprocess.CalledProcessError(1, ["powermetrics"])
    mp, notes = read_mac_power(canned({"pmset": PMSET_BATT, "powermetrics": denied}), use_powermetrics=True)
    assert mp.power_w is None and any("powermetrics" in n for n in notes)
    mp, _ = read_mac_power(canned({"pmset": PMSET_AC, "powermetrics": text}), use_powermetrics=True)
    assert mp.power_w == pytest.approx(0.9) and mp.on_battery is False


def test_a_tool_that_is_not_installed_fails_without_a_child_process(monkeypatch) -> None:
    """serve's deployment record runs the doctor after the load: off a Jetson, `nvpmodel -q` must
    not fork a copy of a server that holds the weights (a tree-RSS sampler saw 912 MiB for 485)."""
    import subprocess

    import pytest

    from edge.telemetry import powermode

    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("a child process was started"))
    with pytest.raises(FileNotFoundError):
        powermode.run_command(["edge-no-such-tool-4f1c"])
    assert powermode.run_or_reason(powermode.run_command, ["edge-no-such-tool-4f1c"]) == (
        None, "edge-no-such-tool-4f1c not found")
