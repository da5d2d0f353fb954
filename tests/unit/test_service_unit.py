"""The generated systemd unit: structure, hardening, quoting, and systemd-analyze verify."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from edge.errors import ConfigError
from edge.service.unit import UnitOptions, parse_unit, render_unit


def _opts(tmp_path: Path, **kw: object) -> UnitOptions:
    exe = tmp_path / "venv" / "bin" / "edge"
    exe.parent.mkdir(parents=True, exist_ok=True)
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    return UnitOptions(exec_path=exe, models_dir=Path("/var/lib/edge/models"), **kw)  # type: ignore[arg-type]


def test_unit_is_notify_with_watchdog_and_sandbox(tmp_path: Path) -> None:
    unit = parse_unit(render_unit(_opts(tmp_path, model="smollm2-135m-instruct", watchdog_s=90)))
    svc = unit["Service"]
    assert svc["Type"] == ["notify"] and svc["WatchdogSec"] == ["90"] and svc["Restart"] == ["on-failure"]
    assert svc["DynamicUser"] == ["yes"] and "User" not in svc
    for key, value in (
        ("NoNewPrivileges", "yes"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
    ):
        assert svc[key] == [value], key
    assert svc["ReadWritePaths"] == ["/var/lib/edge/models"]
    assert svc["StateDirectory"] == ["edge"]
    exec_start = svc["ExecStart"][0].split()
    assert exec_start[0] == str(tmp_path / "venv" / "bin" / "edge")
    assert exec_start[1:3] == ["serve", "smollm2-135m-instruct"]
    assert "--models-dir" in exec_start
    assert int(svc["TimeoutStopSec"][0]) > 30  # drain time plus shutdown
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]


def test_dedicated_user_and_home_paths(tmp_path: Path) -> None:
    opts = UnitOptions(
        exec_path=Path("/home/u/venv/bin/edge"), models_dir=Path("/home/u/models"), user="edge"
    )
    svc = parse_unit(render_unit(opts))["Service"]
    assert svc["User"] == ["edge"] and "DynamicUser" not in svc
    assert svc["ProtectHome"] == ["read-only"]  # the venv lives in /home
    assert "StateDirectory" not in svc


def test_quoting_and_bad_input(tmp_path: Path) -> None:
    opts = UnitOptions(
        exec_path=Path("/opt/edge/bin/edge"), models_dir=Path("/srv/my models"), model="100%model"
    )
    svc = parse_unit(render_unit(opts))["Service"]
    assert "'100%%model'" in svc["ExecStart"][0] or "100%%model" in svc["ExecStart"][0]
    assert svc["ReadWritePaths"] == ["'/srv/my models'"]
    with pytest.raises(ConfigError):
        render_unit(UnitOptions(exec_path=Path("edge"), models_dir=Path("/m")))
    with pytest.raises(ConfigError):
        render_unit(UnitOptions(exec_path=Path("/e"), models_dir=Path("/m"), user="bad user"))


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_analyze_verify_accepts_the_unit(tmp_path: Path) -> None:
    path = tmp_path / "edge.service"
    path.write_text(render_unit(_opts(tmp_path)))
    res = subprocess.run(
        ["systemd-analyze", "verify", str(path)], capture_output=True, text=True, check=False
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Unknown key" not in res.stderr and "Unknown lvalue" not in res.stderr
    bad = tmp_path / "bad.service"
    bad.write_text(
        render_unit(_opts(tmp_path)).replace(str(tmp_path / "venv" / "bin" / "edge"), "/nonexistent/x")
    )
    assert subprocess.run(
        ["systemd-analyze", "verify", str(bad)], capture_output=True, check=False
    ).returncode
