"""`edge bench http` / `edge report` exit statuses and the report folder from a hand-made run."""

from __future__ import annotations

import datetime as dt
import json
import socket
from pathlib import Path
from typing import Any

import pytest

from edge.bench import report
from edge.bench.runner import SCHEMA, BenchConfig, document
from edge.bench.stats import RequestResult, summarize
from edge.bench.table import render
from edge.bench.targets import TargetSpec
from edge.cli import build_parser, main

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens once the socket is closed


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--url", "http://127.0.0.1:9", "--prompt-lengths", "gauss:3"], "unknown kind 'gauss'"),
        (["--url", "http://127.0.0.1:9", "--max-tokens", "uniform:9-1"], "lower bound 9"),
        (["--url", "http://10.1.2.3:8088"], "--allow-remote"),
        (["--url", "http://127.0.0.1:9", "--compare", "http://8.8.8.8:80"], "--allow-remote"),
        (["--url", "http://127.0.0.1:9", "--compare", "vllm"], "expected a URL"),
        (["--url", "http://127.0.0.1:9", "--concurrency", "1,x"], "integers like"),
        (["--url", "http://127.0.0.1:9", "--concurrency", "0,2"], "between 1 and 1024"),
        (["--url", "http://127.0.0.1:9", "--requests", "0"], "requests: must be positive"),
        ([], "give a MODEL"),
        (["--url", "http://127.0.0.1:9", "--compare", "llama-cpp-python"], "needs MODEL"),
    ],
)
def test_usage_errors_exit_2(argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "http", *argv]) == 2
    assert needle in capsys.readouterr().err


def test_unreachable_url_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    port = _closed_port()
    assert main(["bench", "http", "--url", f"http://127.0.0.1:{port}", "--concurrency", "1"]) == 2
    assert f"target http://127.0.0.1:{port} unreachable" in capsys.readouterr().err


class _DeadProc:
    pid = 99999

    def poll(self) -> int:
        return 7

    def send_signal(self, sig: int) -> None:
        raise AssertionError("an exited process is not signalled")

    def wait(self, timeout: float | None = None) -> int:
        return 7

    def kill(self) -> None:
        raise AssertionError("an exited process is not killed")


def test_a_target_that_does_not_start_exits_3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")

    def launcher(cmd: list[str], log: Path) -> _DeadProc:
        log.write_text("boom: cannot load\n")
        return _DeadProc()

    monkeypatch.setattr("edge.bench.targets.popen_launcher", launcher)
    assert main(["bench", "http", str(model), "--concurrency", "1"]) == 3
    err = capsys.readouterr().err
    assert "target edge failed to start: exited with status 7" in err and "boom: cannot load" in err


def test_engine_target_is_still_there() -> None:
    args = build_parser().parse_args(["bench", "engine", "--threads", "1", "--json"])
    assert args.bench_target == "engine" and args.json is True and args.func.__name__ == "run"


def _doc(compare: bool = True, timeline: bool = True, power: bool = False) -> dict[str, Any]:
    cfg = BenchConfig(primary=TargetSpec("url", "url", "http://127.0.0.1:1"),
                      compare=(TargetSpec("url", "b", "http://127.0.0.1:2"),) if compare else (),
                      concurrency=(1, 2, 4), requests=4, warmup=0)
    steps = []
    t = 0.0
    for c, e2e in ((1, 0.2), (2, 0.3), (4, 0.6)):
        for label, slow in (("url", 1.0), ("b", 1.5)) if compare else (("url", 1.0),):
            rs = [RequestResult(0, False, 0.0, 0.01, None, 0, False, 503, "http", "503 busy")]
            rs += [RequestResult(i, False, i * e2e / c, i * e2e / c + e2e * slow, 0.05 * slow * c, 16, True,
                                 200, None, "") for i in range(1, 4)]
            steps.append((summarize(label, c, rs, t, t + 1.0), rs))
            t += 1.0
    temps = [{"t_s": float(k), "temp_c": 50.0 + k, "mode": "nominal", "budget": 1.0 - 0.05 * k,
              "knobs": {"n_threads": 2, "duty": 1.0 - 0.1 * k, "paused": False}} for k in range(6)]
    if power:
        for k, p in enumerate(temps):
            p.update(power_w=6.5 + 0.1 * k, power_budget_w=7.0, energy_j=7.0 * k, energy_tokens=20 * k)
    timelines = {"url": temps} if timeline else {}
    targets = [{"label": "url", "kind": "url", "url": "http://127.0.0.1:1", "model_id": "smol",
                "is_edge": timeline, "launched": False, "command": None}]
    if compare:
        targets.append({**targets[0], "label": "b", "url": "http://127.0.0.1:2", "is_edge": False})
    return document(cfg, targets, steps, timelines, dt.datetime(2026, 1, 2, tzinfo=dt.timezone.utc), 6.0)


def test_table_shows_failures_knee_and_ratios() -> None:
    doc = _doc()
    text = render(doc)
    assert "TTFT p50/p90/p99 ms" in text and "1 (503:1)" in text
    assert "knee url:" in text and "ratios B/A" in text and "b/url" in text
    assert doc["failed_requests"] == 6 and doc["schema"] == SCHEMA
    assert [c["concurrency"] for c in doc["compare"]] == [1, 2, 4]
    assert doc["compare"][0]["e2e_s_p50"] == pytest.approx(1.5)
    md = render(doc, markdown=True)
    assert md.startswith("| target | C |")


def _valid_png(path: Path) -> bool:
    data = path.read_bytes()
    return len(data) > 1000 and data.startswith(PNG_SIGNATURE)


def test_report_folder_from_a_bench_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bench = tmp_path / "run.json"
    bench.write_text(json.dumps(_doc()))
    out = tmp_path / "rep"
    assert main(["report", "--bench", str(bench), "--out", str(out)]) == 0
    assert "report written" in capsys.readouterr().out
    md = (out / "report.md").read_text()
    assert "smol" in md and "## Hardware" in md and "## Memory plan" in md
    images = [line.split("](")[1].rstrip(")") for line in md.splitlines() if line.startswith("![")]
    assert sorted(images) == ["latency.png", "thermal.png", "throughput.png"]
    for name in images:
        assert _valid_png(out / name), name
    assert json.loads((out / "bench.json").read_text()) == json.loads(bench.read_text())
    facts = json.loads((out / "facts.json").read_text())
    assert facts["hardware"]["edge_version"] and facts["model"] is None


def test_report_plots_power_and_tokens_per_joule_when_edge_reads_power(tmp_path: Path) -> None:
    from edge.bench.plots import tokens_per_joule

    doc = _doc(compare=False, power=True)
    path = report.write(tmp_path, doc, {"edge_version": "x"}, "2026-01-02")
    md = path.read_text()
    assert "power.png" in md and _valid_png(tmp_path / "power.png")
    expected = [(float(k), pytest.approx(20 / 7)) for k in range(1, 6)]
    assert tokens_per_joule(doc["timeline"]["url"]) == expected
    plain = report.write(tmp_path / "plain", _doc(compare=False), {"edge_version": "x"}, "2026-01-02")
    assert "No power timeline" in plain.read_text() and not (tmp_path / "plain" / "power.png").exists()


def test_report_without_timeline_has_no_thermal_plot(tmp_path: Path) -> None:
    path = report.write(tmp_path, _doc(compare=False, timeline=False), {"edge_version": "x"}, "2026-01-02")
    md = path.read_text()
    assert "thermal.png" not in md and "No timeline" in md
    assert not (tmp_path / "thermal.png").exists() and _valid_png(tmp_path / "latency.png")


@pytest.mark.parametrize(("content", "needle"), [("not json", "is not JSON"),
                                                 ('{"schema": "other"}', "not an `edge bench http"),
                                                 (json.dumps({"schema": SCHEMA, "schema_version": 99}),
                                                  "schema version 99")])
def test_report_rejects_other_files(tmp_path: Path, content: str, needle: str,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "b.json"
    f.write_text(content)
    assert main(["report", "--bench", str(f), "--out", str(tmp_path / "o")]) == 2
    assert needle in capsys.readouterr().err


def test_settle_defaults_to_a_pause_only_when_comparing() -> None:
    from edge.commands.bench import SETTLE_COMPARE_S, _settle_s
    from edge.scheduler.state import ControllerConfig

    # longer than edge's contention stage waits before it restores threads
    assert _settle_s(None, comparing=True) == SETTLE_COMPARE_S > ControllerConfig().contention_up_s
    assert _settle_s(None, comparing=False) == 0.0
    assert _settle_s(2.5, comparing=True) == 2.5
