"""Deployment records: where each setting came from, what a start writes, `edge history` and its
diff, and reports that never overwrite an older one."""

from __future__ import annotations

import json
import logging
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from edge.cli import build_parser, main
from edge.commands import deployments, history
from edge.commands.report import fresh_dir
from edge.commands.serve import settings_of
from edge.config import Settings, load_profile
from edge.provenance import effective, field_origins
from tests.ggufgen import write_tiny_model

BUILD = {"edge_version": "0.1.0", "llama_cpp_python": "0.3.36", "llama_cpp_build": "unknown",
         "llama_cpp_commit": "abc1234", "ggml_version": "0.9.0", "backends": ["cpu"], "error": None}


def test_origins_follow_the_settings_precedence() -> None:
    fields = ["slots", "port", "host", "n_batch", "threads"]
    flags = {"slots": 2, "port": None}  # None: the flag was not given
    env = {"edge_port": "9000", "EDGE_SLOTS": "3", "OTHER": "x"}  # any case, as pydantic reads it
    got = field_origins(fields, flags, {"host", "slots", "n_batch"}, env)
    assert got == {"slots": "flag", "port": "environment", "host": "file", "n_batch": "file",
                   "threads": "default"}


def test_effective_values_show_the_profile_and_hide_secrets() -> None:
    prof = load_profile("jetson-orin-nano")
    values = {"threads": None, "profile": None, "gpu_layers": "auto", "slots": 4, "api_key": "s3cret",
              "models_dir": Path("/m")}
    got = effective(values, {"slots": "flag", "api_key": "environment"}, prof)
    assert got["profile"] == {"value": "jetson-orin-nano", "from": "profile"}
    assert got["gpu_layers"] == {"value": prof.gpu_layers, "from": "profile"}
    assert got["threads"]["from"] == ("profile" if prof.default_threads is not None else "default")
    assert got["slots"] == {"value": 4, "from": "flag"}
    assert got["api_key"] == {"value": "<set>", "from": "environment"}
    assert got["models_dir"] == {"value": "/m", "from": "default"}
    assert effective({"threads": None}, {}, None)["threads"] == {"value": None, "from": "default"}


def test_serve_flags_file_and_environment_are_told_apart(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "edge.toml"
    cfg.write_text('n_batch = 256\nslots = 3\n')
    monkeypatch.setenv("EDGE_MAX_QUEUE", "7")
    args = build_parser().parse_args(["serve", "--slots", "2", "--config", str(cfg),
                                      "--audit-log", str(tmp_path / "a.jsonl")])
    s = settings_of(args)
    o = s.origins()
    assert (s.slots, o["slots"]) == (2, "flag")  # the flag beats the file
    assert (s.n_batch, o["n_batch"]) == (256, "file")
    assert (s.max_queue, o["max_queue"]) == (7, "environment")
    assert (s.audit_log, o["audit_log"]) == (tmp_path / "a.jsonl", "flag")
    assert o["port"] == "default" and set(o) == set(Settings.model_fields)


def _settings(tmp_path: Path, **kw: Any) -> Settings:
    s = Settings(state_dir=tmp_path / "state", **kw)
    s.set_origins({k: "flag" for k in kw})
    return s


def _record(settings: Settings, model: Path, when: datetime) -> dict[str, Any]:
    return deployments.start_record(settings, [("served", model)], now=lambda: when,
                                    doctor=lambda s: {"platform": {"kind": "linux"}}, build=lambda: BUILD)


def test_a_start_writes_a_record_and_history_diffs_two(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    model = write_tiny_model(tmp_path / "tiny.gguf", file_type=1)
    t0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    first = _record(_settings(tmp_path, slots=4), model, t0)
    (m,) = first["models"]
    assert (m["role"], m["quantization"], len(m["sha256"])) == ("served", "F16", 64)
    assert first["settings"]["slots"] == {"value": 4, "from": "flag"}
    assert first["versions"]["llama_cpp_commit"] == "abc1234"
    d = deployments.deployments_dir(_settings(tmp_path))
    a = deployments.write_record(first, d)
    b = deployments.write_record(_record(_settings(tmp_path, slots=2), model, t0.replace(minute=9)), d)
    again = deployments.write_record(first, d)  # same second: a new file, never an overwrite
    assert (a.name, b.name, again.name) == ("2026-01-02T03-04-05Z.json", "2026-01-02T03-09-05Z.json",
                                            "2026-01-02T03-04-05Z-2.json")
    again.unlink()

    assert main(["history", "--state-dir", str(tmp_path / "state")]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert len(listed) == 2 and "tiny.gguf F16" in listed[0] and "abc1234" in listed[0]
    assert main(["history", "--diff", "--state-dir", str(tmp_path / "state")]) == 0
    out = capsys.readouterr().out
    assert "1 change" in out and "settings.slots: 4 (flag) -> 2 (flag)" in out
    assert main(["history", "--diff", "-1", "1", "--json", "--state-dir", str(tmp_path / "state")]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["changes"] == [{"key": "settings.slots", "a": "2 (flag)", "b": "4 (flag)"}]
    assert main(["history", "--diff", "nope", "1", "--state-dir", str(tmp_path / "state")]) == 2


def test_history_with_too_few_records(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["history", "--state-dir", str(tmp_path)]) == 0
    assert "no deployment records yet" in capsys.readouterr().out
    assert main(["history", "--diff", "--state-dir", str(tmp_path)]) == 2


def test_the_digest_is_reused_only_for_the_same_unchanged_file(tmp_path: Path) -> None:
    model = write_tiny_model(tmp_path / "tiny.gguf")
    real = deployments.model_facts("served", model)["sha256"]
    prev = [{**deployments.model_facts("served", model), "sha256": "f" * 64}]
    assert deployments.model_facts("served", model, prev)["sha256"] == "f" * 64  # not hashed again
    os.utime(model, ns=(1, 1))
    assert deployments.model_facts("served", model, prev)["sha256"] == real  # changed: hashed


def test_diff_names_models_and_versions() -> None:
    a = {"started_at": "x", "pid": 1, "versions": BUILD,
         "models": [{"role": "served", "sha256": "aa", "quantization": "Q4_1"}]}
    b = {"started_at": "y", "pid": 2, "versions": {**BUILD, "llama_cpp_commit": "def5678"},
         "models": [{"role": "served", "sha256": "bb", "quantization": "Q4_0"},
                    {"role": "draft", "sha256": "cc", "quantization": "Q8_0"}]}
    keys = {k: (x, y) for k, x, y in history.diff(a, b)}
    assert keys["versions.llama_cpp_commit"] == ("abc1234", "def5678")
    assert keys["models.served.quantization"] == ("Q4_1", "Q4_0")
    assert keys["models.draft.sha256"] == (None, "cc")
    assert "started_at" not in keys and "pid" not in keys


def test_record_start_never_fails_the_start(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "edge.deployments")
    blocked = tmp_path / "file"
    blocked.write_text("")
    s = Settings(state_dir=blocked)  # deployments/ cannot be made under a file
    model = write_tiny_model(tmp_path / "tiny.gguf")
    assert deployments.record_start(s, [model]) is None
    assert "deployment record not written" in caplog.text and "NotADirectoryError" in caplog.text
    ok = Settings(state_dir=tmp_path / "state")
    path = deployments.record_start(ok, [model])  # the real build and doctor
    assert path is not None and path.parent == tmp_path / "state" / "deployments"
    doc = json.loads(path.read_text())
    assert doc["versions"]["llama_cpp_python"] and doc["doctor"]["platform"]["kind"]
    assert "llama.cpp build" in caplog.text  # what runs, logged once at the start


def test_report_folders_are_never_reused(tmp_path: Path) -> None:
    base = tmp_path / "edge-report-2026-01-02"
    first = fresh_dir(base)
    (first / "report.md").write_text("kept")
    second, third = fresh_dir(base), fresh_dir(base)
    assert (first, second) == (base, tmp_path / "edge-report-2026-01-02-2")
    assert third == tmp_path / "edge-report-2026-01-02-2"  # still empty: used, nothing lost
    (second / "x").write_text("")
    assert fresh_dir(base) == tmp_path / "edge-report-2026-01-02-3"
    assert (first / "report.md").read_text() == "kept"


def test_the_last_record_is_found_without_reading_months_of_others(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A start reuses the last record's digests; it reads the newest few files, not all of them
    (an unreadable old file would otherwise be parsed, and logged, on every start)."""
    d = tmp_path / "deployments"
    d.mkdir()
    for day in range(1, 21):
        (d / f"2026-01-{day:02d}T00-00-00Z.json").write_text("{broken" if day < 18 else json.dumps(
            {"schema": deployments.SCHEMA, "started_at": f"2026-01-{day:02d}T00:00:00Z",
             "models": [{"role": "served", "sha256": f"{day}"}]}))
    caplog.set_level(logging.WARNING, "edge.deployments")
    assert deployments.latest_models(d) == [{"role": "served", "sha256": "20"}]
    assert "skipping unreadable" not in caplog.text  # the 17 old files were never opened
    assert [p.name[:10] for p, _ in deployments.load_records(d, newest=3)] == [
        "2026-01-18", "2026-01-19", "2026-01-20"]
    assert len(deployments.load_records(d)) == 3 and "skipping unreadable" in caplog.text
