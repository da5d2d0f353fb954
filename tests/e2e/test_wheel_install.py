"""A built wheel installed into a fresh venv outside the checkout works on its own.

The wheel is built from this checkout (`pip wheel --no-deps`), installed with
`pip install --no-deps` into a new venv under a temporary folder, and every command
runs there with that folder as the working directory, so nothing can be found
through the checkout: device profiles, throughput tables and the model catalog
must come from the wheel's package data. The new venv borrows the test venv's
third-party packages through a .pth line (the checkout's editable install is not
among them: a directory named in a .pth file is not scanned for further .pth
files), and `pip check` proves the wheel's declared requirements are satisfied.
"""

from __future__ import annotations

import json
import os
import signal
import site
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import TEST_MODELS_DIR
from tests.e2e.conftest import REPO, free_port

pytestmark = pytest.mark.e2e


def _run(cmd: list[str], cwd: Path, timeout_s: float = 300.0, env: dict[str, str] | None = None) -> str:
    got = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout_s, env=env)
    assert got.returncode == 0, f"{cmd} exited {got.returncode}:\n{got.stdout[-2000:]}\n{got.stderr[-3000:]}"
    return got.stdout


Installed = tuple[Path, Path, dict[str, str]]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """(venv bin dir, a working folder outside the checkout, the environment to run in)."""
    root = tmp_path_factory.mktemp("wheel")
    dist = root / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist),
          str(REPO)], cwd=root)
    (wheel,) = dist.glob("edge-*.whl")
    venv = root / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], cwd=root)
    py = venv / "bin" / "python"
    purelib = _run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=root)
    deps = [p for p in site.getsitepackages() if Path(p).is_dir()]
    (Path(purelib.strip()) / "edge-test-deps.pth").write_text("\n".join(deps) + "\n")
    _run([str(py), "-m", "pip", "install", "--no-deps", "-q", str(wheel)], cwd=root)
    work = root / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("EDGE_") and k != "PYTHONPATH"}
    env["HOME"] = str(root / "home")  # the per-user model store, empty
    return venv / "bin", work, env


def test_the_wheel_carries_its_data_and_imports_from_the_venv(installed: Installed) -> None:
    bin_dir, work, env = installed
    out = _run([str(bin_dir / "python"), "-c",
                "import edge, edge.config as c, edge.store as s; "
                "print(edge.__file__); print(c.PROFILES_DIR); print(s.CATALOG_PATH); "
                "print(sorted(c.list_profiles())); print(sorted(s.load_catalog()))"], cwd=work, env=env)
    mod, profiles_dir, catalog, names, models = out.strip().splitlines()
    venv = str(bin_dir.parent)
    assert mod.startswith(venv) and profiles_dir.startswith(venv) and catalog.startswith(venv)
    assert str(REPO) not in out
    assert "jetson-orin-nano" in names and "smollm2-135m-instruct" in models
    _run([str(bin_dir / "python"), "-m", "pip", "check"], cwd=work, env=env)


def test_doctor_plan_and_sim_run_from_the_installed_wheel(installed: Installed,
                                                          smollm2_path: Path) -> None:
    bin_dir, work, env = installed
    edge = str(bin_dir / "edge")
    doctor = json.loads(_run([edge, "doctor", "--json"], cwd=work, env=env))
    assert doctor["profile"]["name"] and doctor["profile"]["thermal_limit_c"] > 0
    assert doctor["backends"]["has_cpu"] is True
    plan = json.loads(_run([edge, "plan", "smollm2-135m-instruct", "--json", "--ctx", "1024",
                            "--models-dir", str(TEST_MODELS_DIR)], cwd=work, env=env))
    assert plan["fits"] is True and plan["n_ctx"] == 1024 and plan["weights_bytes"] > 50 << 20
    rows = json.loads(_run([edge, "sim", "--json", "--scenario", "chat-hot", "--policy", "edge",
                            "--duration-s", "120"], cwd=work, env=env))
    (row,) = rows
    assert row["policy"] == "edge" and row["tokens"] > 0 and row["seconds_hw_throttled"] == 0


def test_serve_from_the_installed_wheel_answers_a_chat(installed: Installed,
                                                       smollm2_path: Path) -> None:
    bin_dir, work, env = installed
    port = free_port()
    log_path = work / "serve.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen([str(bin_dir / "edge"), "serve", str(smollm2_path), "--port", str(port),
                                 "--slots", "1", "--ctx", "512", "--threads", "2"],
                                cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120.0
        while time.monotonic() < deadline:
            assert proc.poll() is None, log_path.read_text()[-3000:]
            try:
                if httpx.get(url + "/ready", timeout=2.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        r = httpx.post(url + "/v1/chat/completions", timeout=60.0, json={"model": smollm2_path.stem,
            "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8, "temperature": 0})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["choices"][0]["message"]["content"] and body["usage"]["completion_tokens"] > 0
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
