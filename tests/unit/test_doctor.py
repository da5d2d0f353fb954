"""`edge doctor` on fake machines: stable JSON keys, readable text, never a crash."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from edge.commands import doctor
from edge.telemetry.sample import Sample
from tests import fakesys
from tests.fakesys import GiB, MiB

TOP_KEYS = {
    "edge_version",
    "platform",
    "profile",
    "backends",
    "build",
    "cpu",
    "memory",
    "thermal",
    "telemetry",
    "power",
    "errors",
}
FAKE_BACKEND = SimpleNamespace(
    llama_cpp_version="0.3.36",
    has_cpu=True,
    has_cuda=True,
    has_metal=False,
    has_blas=False,
    gpu_offload=True,
    cpu_extra_buffers=True,
    system_info="CUDA : ARCHS = 870 | CPU : NEON = 1 |",
    libraries=("libggml-cuda.so",),
    error=None,
)


FAKE_BUILD = SimpleNamespace(to_dict=lambda: {
    "llama_cpp_python": "0.3.36", "llama_cpp_build": "unknown", "llama_cpp_commit": "abc1234",
    "ggml_version": "0.9.0", "backends": ["cpu", "cuda"], "error": None})


@pytest.fixture(autouse=True)
def _no_llama_build(monkeypatch: pytest.MonkeyPatch) -> None:
    """The llama.cpp build is a fake too: these tests never load llama.cpp."""
    monkeypatch.setattr(doctor, "_build_info", lambda: FAKE_BUILD)


def linux() -> str:
    return "Linux"


def aarch64() -> str:
    return "aarch64"


def run_cli(argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> str:
    """Run `edge doctor ARGV` through its own parser, without loading llama.cpp."""
    monkeypatch.setattr("edge.runtime.llama.backend.probe_backends", lambda: FAKE_BACKEND)
    parser = argparse.ArgumentParser(prog="edge")
    doctor.register(parser.add_subparsers())
    args = parser.parse_args(["doctor", *argv])
    assert args.func(args) == 0
    return capsys.readouterr().out


def test_report_on_agx_orin(tmp_path: Path) -> None:
    fakesys.agx_orin(tmp_path)
    r = doctor.report(tmp_path, system=linux, machine=aarch64, backends=lambda: FAKE_BACKEND)
    assert set(r) == TOP_KEYS
    assert r["platform"]["kind"] == "jetson"
    assert r["profile"] == {
        "name": "jetson-orin-agx",
        "source": "detected",
        "thermal_limit_c": 99.0,
        "thermal_critical_c": 104.5,
        "unified_memory": True,
        "memory_reserve_bytes": 4 * GiB,
    }
    assert r["backends"]["has_cuda"] is True and r["backends"]["error"] is None
    assert r["backends"]["cpu_extra_buffers"] is True  # no AMX in this build: repacked kernels stay
    assert r["memory"]["available_bytes"] == 50 * GiB
    assert r["memory"]["nvmap_used_bytes"] == 2 * GiB
    assert r["memory"]["cgroup"]["version"] == 2 and r["memory"]["cgroup"]["limit_bytes"] is None
    tj = next(z for z in r["thermal"]["zones"] if z["type"] == "tj-therm")
    assert tj["passive_trip_c"] == 99.0 and tj["critical_trip_c"] == 104.5
    assert [t["type"] for t in tj["trips"]] == ["active", "active", "passive", "critical"]
    t = r["telemetry"]
    assert (t["spec"], t["source"]) == ("auto", "jetson")
    assert t["sample"]["temp_c"] == 62.25 and t["sample"]["limit_c"] == 99.0
    assert t["sample"]["power_w"] == pytest.approx(21.0)
    json.dumps(r)  # every value is JSON-ready


def test_json_output_through_the_cli(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fakesys.cgroup_container(tmp_path)
    out = run_cli(["--json", "--root", str(tmp_path), "--telemetry", "linux"], monkeypatch, capsys)
    r = json.loads(out)
    assert set(r) == TOP_KEYS
    assert r["memory"]["cgroup"]["limit_bytes"] == 2 * GiB
    assert r["memory"]["available_bytes"] == 2 * GiB - 1280 * MiB
    assert r["cpu"]["quota_cpus"] == 1.5
    assert r["telemetry"]["source"] == "linux"
    assert r["telemetry"]["sample"]["memory_pressure"] == "heavy"
    assert r["build"]["llama_cpp_commit"] == "abc1234" and r["build"]["backends"] == ["cpu", "cuda"]


def test_text_output_shows_zones_trips_and_telemetry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fakesys.orin_nano(tmp_path)
    out = run_cli(["--root", str(tmp_path), "--telemetry", "jetson"], monkeypatch, capsys)
    assert "profile    jetson-orin-nano (detected); limit 99.0 C, critical 104.5 C" in out
    assert "tj-thermal" in out and "passive 99.0 C, critical 104.5 C" in out
    assert "telemetry  jetson" in out
    assert "power 7.5 W" in out
    assert "cuda" in out and "gpu offload yes" in out
    assert "llama.cpp  build unknown, commit abc1234, ggml 0.9.0; compiled in: cpu, cuda" in out


def test_broken_box_prints_unknowns_and_problems(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fakesys.broken_box(tmp_path)
    out = run_cli(["--root", str(tmp_path), "--telemetry", "linux"], monkeypatch, capsys)
    assert "unknown" in out
    assert "problems" in out
    assert "EISDIR" in out and "not a number: 'n/a'" in out
    assert "kernel throttling unknown" in out


def test_bad_telemetry_spec_and_profile_are_reported_not_fatal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fakesys.generic_x86(tmp_path)
    out = run_cli(
        ["--json", "--root", str(tmp_path), "--telemetry", "bogus", "--profile", "no-such-board"],
        monkeypatch,
        capsys,
    )
    r = json.loads(out)
    assert r["telemetry"]["source"] is None and "unknown source 'bogus'" in r["telemetry"]["error"]
    assert r["profile"]["name"] == "no-such-board" and "unknown profile" in r["profile"]["error"]
    assert any("unknown profile" in e for e in r["errors"])
    text = run_cli(["--root", str(tmp_path), "--telemetry", "bogus"], monkeypatch, capsys)
    assert "telemetry source failed: ConfigError: invalid setting telemetry: unknown source 'bogus'" in text


def test_macos_without_native_layer_still_reports(tmp_path: Path) -> None:
    r = doctor.report(
        tmp_path,
        system=lambda: "Darwin",
        machine=lambda: "arm64",
        backends=lambda: FAKE_BACKEND,
        virtual_memory=lambda: SimpleNamespace(total=16 * GiB, available=10 * GiB),
    )
    assert r["platform"]["kind"] == "apple-silicon" and r["profile"]["name"] == "apple-silicon-laptop"
    assert r["memory"]["available_bytes"] == 10 * GiB
    assert r["telemetry"]["source"] == "macos"
    sample = r["telemetry"]["sample"]
    assert sample["thermal_pressure"] is None  # unknown on this Linux box, never "nominal"
    assert any("native layer unavailable" in e for e in sample["errors"])


def test_sim_telemetry_is_delegated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[str] = []

    class SimSource:
        name = "sim:jetson-orin-nano"

        def read(self) -> Sample:
            return Sample(t_s=0.0, source=self.name, temp_c=41.0)

        def close(self) -> None:
            made.append("closed")

    def make_source(profile: str, clock: object = None, ambient_file: object = None) -> SimSource:
        made.append(profile)
        return SimSource()

    monkeypatch.setattr("edge.sim.device.make_source", make_source)
    r = doctor.report(
        tmp_path, telemetry="sim:jetson-orin-nano", system=linux, machine=aarch64, backends=None
    )
    t = r["telemetry"]
    assert t["source"] == "sim" and t["error"] is None
    assert t["sample"]["source"] == "sim:jetson-orin-nano" and t["sample"]["temp_c"] == 41.0
    assert made == ["jetson-orin-nano", "closed"]


def test_detect_resolves_every_spec(tmp_path: Path) -> None:
    from edge.errors import ConfigError
    from edge.telemetry.detect import NullSource, make_source, resolve

    fakesys.orin_nano(tmp_path / "nano")
    fakesys.generic_x86(tmp_path / "pc")
    assert resolve("auto", tmp_path / "nano", system=linux, machine=aarch64).kind == "jetson"
    assert resolve("auto", tmp_path / "pc", system=linux, machine=aarch64).kind == "linux"
    assert resolve("auto", tmp_path, system=lambda: "Darwin", machine=lambda: "arm64").kind == "macos"
    assert resolve("auto", tmp_path, system=lambda: "Windows", machine=lambda: "AMD64").kind == "none"
    assert resolve("linux", tmp_path / "nano").kind == "linux"  # an explicit choice wins
    with pytest.raises(ConfigError):
        resolve("sim:", tmp_path)
    src = make_source("none", tmp_path / "sys", tmp_path / "proc")
    assert isinstance(src, NullSource)
    s = src.read()
    assert s.source == "none" and s.temp_c is None and not s.thermal_known and s.errors


def nvpmodel_7w(argv: object) -> str:
    return "NV Power Mode: 7W\n1\n"


def test_power_on_an_orin_nano_with_nvpmodel_and_a_fan(tmp_path: Path) -> None:
    fs = fakesys.orin_nano(tmp_path)
    fs.fan("pwmfan", 128, 2300)
    fs.etc("nvpmodel.conf", "< POWER_MODEL ID=0 NAME=15W >\n< POWER_MODEL ID=1 NAME=7W >\n")
    r = doctor.report(tmp_path, system=linux, machine=aarch64, backends=lambda: FAKE_BACKEND,
                      runner=nvpmodel_7w)
    p = r["power"]
    assert p["inputs_present"] == ["ina3221"] and "rapl" in p["inputs_absent"]
    assert p["power_source"] == "ina3221" and p["power_w"] > 7.0
    assert p["power_mode"] == {"id": 1, "name": "7W", "budget_w": 7.0}
    assert p["fans"][0]["rpm"] == 2300
    text = doctor.render(r)
    assert "nvpmodel mode 1 7W: budget 7 W" in text and "INA3221 rails" in text
    assert "jtop " in text  # installed or not, its state is a note, never a failure


def test_power_on_a_machine_without_any_power_input(tmp_path: Path) -> None:
    fakesys.FakeSys(tmp_path)  # this VM: nothing under /sys
    r = doctor.report(tmp_path, system=linux, machine=lambda: "x86_64", backends=lambda: FAKE_BACKEND,
                      runner=lambda argv: (_ for _ in ()).throw(FileNotFoundError("nvpmodel")))
    p = r["power"]
    assert p["inputs_present"] == [] and set(p["inputs_absent"]) == {"ina3221", "power_supply", "hwmon_power",
                                                                     "rapl"}
    assert p["power_w"] is None and p["power_mode"] is None and p["errors"] == []
    text = doctor.render(r)
    assert "inputs: none; not found:" in text and "no power input on this machine" in text
    assert "nvpmodel not available" in text


def test_power_on_a_laptop_on_battery(tmp_path: Path) -> None:
    fakesys.laptop_with_battery(tmp_path, capacity=42)
    r = doctor.report(tmp_path, system=linux, machine=lambda: "x86_64", backends=lambda: FAKE_BACKEND,
                      runner=lambda argv: (_ for _ in ()).throw(FileNotFoundError("nvpmodel")))
    assert r["power"]["on_battery"] is True and r["power"]["battery_pct"] == 42.0
    assert "on battery, battery 42%" in doctor.render(r)
