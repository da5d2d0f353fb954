"""edge.probe on fake trees: every platform branch, memory with cgroups, CPUs, zones."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from edge.config import list_profiles, load_profile
from edge.probe import (
    PlatformInfo,
    PlatformKind,
    cpu_info,
    cpu_quota,
    detect_platform,
    memory_available_bytes,
    memory_total_bytes,
    nvmap_used_bytes,
    parse_cpu_list,
    probe_system,
    profile_for,
    thermal_zones,
)
from tests import fakesys
from tests.fakesys import FakeSys, GiB, MiB


def linux() -> str:
    return "Linux"


def aarch64() -> str:
    return "aarch64"


@pytest.mark.parametrize(
    ("builder", "kind", "profile"),
    [
        (fakesys.orin_nano, PlatformKind.JETSON, "jetson-orin-nano"),
        (fakesys.agx_orin, PlatformKind.JETSON, "jetson-orin-agx"),
        (fakesys.raspberry_pi, PlatformKind.RASPBERRY_PI, "raspberry-pi-5"),
        (fakesys.generic_x86, PlatformKind.LINUX, "generic-x86-cpu"),
        (fakesys.cgroup_container, PlatformKind.LINUX, "generic-x86-cpu"),
    ],
)
def test_platform_and_profile(tmp_path: Path, builder, kind: PlatformKind, profile: str) -> None:
    builder(tmp_path)
    info = detect_platform(tmp_path, system=linux, machine=aarch64)
    assert info.kind is kind
    assert profile_for(info) == profile


def test_jetson_model_and_l4t(tmp_path: Path) -> None:
    fakesys.agx_orin(tmp_path)
    info = detect_platform(tmp_path, system=linux, machine=aarch64)
    assert info.model == "NVIDIA Jetson AGX Orin Developer Kit"  # trailing NUL stripped
    assert info.l4t_release == "R36.4.0"


def test_jetson_from_nv_tegra_release_alone(tmp_path: Path) -> None:
    fs = FakeSys(tmp_path)
    fs.nv_tegra_release("# R35 (release), REVISION: 5.0\n")
    info = detect_platform(tmp_path, system=linux, machine=aarch64)
    assert info.kind is PlatformKind.JETSON and info.model is None
    assert profile_for(info) == "jetson-orin-nano"


def test_device_tree_model_under_sysfs_firmware(tmp_path: Path) -> None:
    fs = FakeSys(tmp_path)
    fs.write(fs.sys / "firmware/devicetree/base/model", "Raspberry Pi 4 Model B Rev 1.4\x00")
    assert detect_platform(tmp_path, system=linux, machine=aarch64).kind is PlatformKind.RASPBERRY_PI


@pytest.mark.parametrize(
    ("machine", "kind", "profile"),
    [
        ("arm64", PlatformKind.APPLE_SILICON, "apple-silicon-laptop"),
        ("x86_64", PlatformKind.MACOS_INTEL, "generic-x86-cpu"),
    ],
)
def test_macos(tmp_path: Path, machine: str, kind: PlatformKind, profile: str) -> None:
    info = detect_platform(tmp_path, system=lambda: "Darwin", machine=lambda: machine)
    assert info.kind is kind and profile_for(info) == profile


def test_every_detected_profile_exists() -> None:
    names = set(list_profiles())
    for kind in PlatformKind:
        for model in (None, "NVIDIA Jetson AGX Orin", "NVIDIA Jetson Orin NX"):
            name = profile_for(PlatformInfo(kind, "Linux", "aarch64", model))
            assert name in names
            assert load_profile(name).thermal_limit_c > 0


def test_memory_available_in_a_cgroup_v2_container(tmp_path: Path) -> None:
    fakesys.cgroup_container(tmp_path)
    assert memory_available_bytes(tmp_path) == 2 * GiB - (1536 - 256) * MiB
    assert memory_total_bytes(tmp_path) == 2 * GiB  # the container's RAM, not the host's 64 GiB


def test_memory_available_in_a_cgroup_v1_container(tmp_path: Path) -> None:
    fakesys.cgroup_v1_container(tmp_path)
    assert memory_available_bytes(tmp_path) == 4 * GiB - (GiB - 8 * MiB)


def test_memory_without_limit_is_memavailable(tmp_path: Path) -> None:
    fakesys.generic_x86(tmp_path)
    assert memory_available_bytes(tmp_path) == 20 * GiB
    assert memory_total_bytes(tmp_path) == 32 * GiB


def test_memory_unknown_without_proc(tmp_path: Path) -> None:
    assert memory_available_bytes(tmp_path) is None
    assert memory_total_bytes(tmp_path) is None


def test_jetson_nvmap(tmp_path: Path) -> None:
    fakesys.agx_orin(tmp_path)
    assert nvmap_used_bytes(tmp_path) == 2 * GiB


def test_cpu_quota_v2_v1_and_none(tmp_path: Path) -> None:
    fakesys.cgroup_container(tmp_path / "a")
    fakesys.cgroup_v1_container(tmp_path / "b")
    fakesys.generic_x86(tmp_path / "c")
    assert cpu_quota(tmp_path / "a") == 1.5
    assert cpu_quota(tmp_path / "b") == 2.0
    assert cpu_quota(tmp_path / "c") is None


def test_cpu_info_sizes_threads_to_the_quota(tmp_path: Path) -> None:
    fakesys.cgroup_container(tmp_path)  # 16 CPUs online ("0-15")
    info = cpu_info(tmp_path, cpu_count=lambda: 99, affinity=lambda: 12)
    assert (info.logical, info.usable, info.quota_cpus, info.effective) == (16, 12, 1.5, 2)
    bare = cpu_info(tmp_path / "none", cpu_count=lambda: 8, affinity=lambda: None)
    assert bare.effective == 8 and bare.quota_cpus is None


@pytest.mark.parametrize(("text", "n"), [("0-3", 4), ("0", 1), ("0-3,6,8-9", 7), ("x", None)])
def test_parse_cpu_list(text: str, n: int | None) -> None:
    assert parse_cpu_list(text) == n


def test_thermal_zones_with_every_trip(tmp_path: Path) -> None:
    fakesys.agx_orin(tmp_path)
    zones = {z.name: z for z in thermal_zones(tmp_path)}
    assert set(zones) == set(fakesys.ORIN_ZONES)
    tj = zones["tj"]
    assert tj.type == "tj-therm" and tj.temp_c == 62.25
    assert [(t.kind, t.temp_c) for t in tj.trips] == [
        ("active", 46.0),
        ("active", 60.0),
        ("passive", 99.0),
        ("critical", 104.5),
    ]
    assert all(t.hyst_c == 2.0 for t in tj.trips)
    assert zones["cv2"].temp_c is None


def test_probe_system_gathers_everything(tmp_path: Path) -> None:
    fs = fakesys.orin_nano(tmp_path)
    backend = SimpleNamespace(has_cuda=True, gpu_offload=True, error=None)
    facts = probe_system(
        tmp_path,
        system=linux,
        machine=aarch64,
        reader=fs.reader,
        cpu_count=lambda: 6,
        affinity=lambda: 6,
        backends=lambda: backend,
    )
    assert facts.platform.kind is PlatformKind.JETSON
    assert (facts.profile, facts.profile_source) == ("jetson-orin-nano", "detected")
    assert facts.cpu.effective == 6
    assert facts.memory.available_bytes == 5 * GiB and facts.memory.nvmap_used_bytes == 300 * MiB
    assert len(facts.zones) == 9 and len(facts.cpufreq) == 6 and len(facts.cooling) == 3
    assert facts.backends is backend and facts.backends_error is None
    assert facts.errors == ()


def test_probe_system_survives_a_broken_box_and_missing_backend(tmp_path: Path) -> None:
    fs = fakesys.broken_box(tmp_path)

    def no_backend() -> object:
        raise ImportError("No module named 'edge.runtime.llama.backend'")

    facts = probe_system(
        tmp_path, profile_override="raspberry-pi-5", system=linux, machine=aarch64,
        reader=fs.reader, backends=no_backend,
    )  # fmt: skip
    assert facts.profile == "raspberry-pi-5" and facts.profile_source == "settings"
    assert facts.backends is None and "ImportError" in (facts.backends_error or "")
    assert [z.temp_c for z in facts.zones] == [None, None, None, None, 63.0]
    assert any("ENODATA" in e for e in facts.errors)
    assert facts.memory.available_bytes == 3 * GiB


def test_probe_on_macos_uses_psutil_memory(tmp_path: Path) -> None:
    vm = SimpleNamespace(total=16 * GiB, available=10 * GiB)
    facts = probe_system(
        tmp_path, system=lambda: "Darwin", machine=lambda: "arm64", backends=None, virtual_memory=lambda: vm
    )
    assert facts.platform.kind is PlatformKind.APPLE_SILICON
    assert facts.profile == "apple-silicon-laptop"
    assert (facts.memory.total_bytes, facts.memory.available_bytes) == (16 * GiB, 10 * GiB)
