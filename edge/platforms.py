"""Which platform is this, and which device profile fits it: no other edge module imported.

Telemetry, the probe, the planner and the service all ask this one module, so a
Jetson, a Mac or a Pi is recognised the same way everywhere. Every function takes
the filesystem roots and platform calls as parameters (tests describe a device as a
fake tree); unreadable files read as absent.
"""

from __future__ import annotations

import platform as _platform
import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

Reader = Callable[[Path], str]


def read_file(path: Path) -> str:
    """Production reader: one small sysfs/procfs file."""
    with open(path, encoding="ascii", errors="replace") as fh:
        return fh.read()


def _text(reader: Reader, path: Path) -> str | None:
    """Content stripped of whitespace and NULs; None when missing, unreadable or empty."""
    try:
        return reader(path).strip().strip("\x00").strip() or None
    except OSError:
        return None


class PlatformKind(str, Enum):
    JETSON = "jetson"
    APPLE_SILICON = "apple-silicon"
    MACOS_INTEL = "macos-intel"
    RASPBERRY_PI = "raspberry-pi"
    LINUX = "linux"
    OTHER = "other"


@dataclass(frozen=True)
class PlatformInfo:
    kind: PlatformKind
    system: str  # platform.system(): "Linux", "Darwin", ...
    machine: str  # platform.machine(): "aarch64", "arm64", "x86_64"
    model: str | None  # device-tree model, e.g. "NVIDIA Jetson AGX Orin Developer Kit"
    l4t_release: str | None = None  # from /etc/nv_tegra_release on a Jetson, e.g. "R36.4.0"


def fs_roots(root: Path, sysfs_root: Path | None, procfs_root: Path | None) -> tuple[Path, Path]:
    return sysfs_root or root / "sys", procfs_root or root / "proc"


def read_device_model(
    root: Path = Path("/"),
    sysfs_root: Path | None = None,
    procfs_root: Path | None = None,
    reader: Reader = read_file,
) -> str | None:
    """Device-tree model string (trailing NUL removed); None on machines without a device tree."""
    sys_root, proc_root = fs_roots(root, sysfs_root, procfs_root)
    for path in (
        proc_root / "device-tree" / "model",
        sys_root / "firmware" / "devicetree" / "base" / "model",
    ):
        text = _text(reader, path)
        if text:
            return text
    return None


def detect_platform(
    root: Path = Path("/"),
    sysfs_root: Path | None = None,
    procfs_root: Path | None = None,
    system: Callable[[], str] = _platform.system,
    machine: Callable[[], str] = _platform.machine,
    reader: Reader = read_file,
) -> PlatformInfo:
    sys_name, arch = system(), machine()
    if sys_name == "Darwin":
        kind = PlatformKind.APPLE_SILICON if arch in ("arm64", "aarch64") else PlatformKind.MACOS_INTEL
        return PlatformInfo(kind, sys_name, arch, None)
    model = read_device_model(root, sysfs_root, procfs_root, reader)
    l4t = _text(reader, root / "etc" / "nv_tegra_release")
    l4t_line = _l4t_version(l4t.splitlines()[0]) if l4t else None
    low = (model or "").lower()
    if "nvidia jetson" in low or "orin" in low or l4t_line:
        kind = PlatformKind.JETSON
    elif low.startswith("raspberry pi"):
        kind = PlatformKind.RASPBERRY_PI
    elif sys_name == "Linux":
        kind = PlatformKind.LINUX
    else:
        kind = PlatformKind.OTHER
    return PlatformInfo(kind, sys_name, arch, model, l4t_line)


def _l4t_version(line: str) -> str:
    """'# R36 (release), REVISION: 4.0, GCID: ...' -> 'R36.4.0' (the line itself if unparsable)."""
    m = re.match(r"#\s*R(\d+)\b.*?REVISION:\s*([\d.]+)", line)
    return f"R{m.group(1)}.{m.group(2).rstrip('.')}" if m else line.strip()


def profile_for(info: PlatformInfo) -> str:
    """The device profile (configs/devices/NAME.toml) that fits this platform."""
    if info.kind is PlatformKind.JETSON:
        return "jetson-orin-agx" if "agx" in (info.model or "").lower() else "jetson-orin-nano"
    if info.kind is PlatformKind.APPLE_SILICON:
        return "apple-silicon-laptop"
    if info.kind is PlatformKind.RASPBERRY_PI:
        return "raspberry-pi-5"
    return "generic-x86-cpu"


def detected_profile_name(sysfs_root: Path | None = None, procfs_root: Path | None = None) -> str:
    """The device profile that fits the platform this runs on."""
    return profile_for(detect_platform(sysfs_root=sysfs_root, procfs_root=procfs_root))
