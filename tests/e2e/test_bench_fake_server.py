"""`edge bench http` against a fake OpenAI-compatible server with injected delays and failures.

Real time over loopback (delays of 20-100 ms), so these live with the e2e tests; each
is bounded by pytest-timeout, and a hanging request must cost one --timeout, not the run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from edge.bench.runner import BenchConfig, run_bench
from edge.bench.targets import TargetSpec
from edge.cli import main

from .fake_openai import Behaviour, FakeOpenAI

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

SLACK_S = 0.002  # timers may fire a hair early against the client's clock
TOLERANCE_S = 0.04  # scheduling noise on a loaded 2-core machine, on top of the injected delay
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _cfg(url: str, **kw: Any) -> BenchConfig:
    base: dict[str, Any] = dict(primary=TargetSpec("url", "url", url), concurrency=(1,), requests=10,
                                warmup=0, prompt_lengths="fixed:8", max_tokens="fixed:4", timeout_s=5.0)
    base.update(kw)
    return BenchConfig(**base)


def _near(value: float | None, injected: float) -> bool:
    return value is not None and injected - SLACK_S <= value <= injected + TOLERANCE_S


def test_percentiles_match_injected_delays() -> None:
    # 8 requests with a 20 ms first token, then 2 with 100 ms; 4 tokens 30 ms apart each
    def plan(n: int) -> Behaviour:
        return Behaviour(ttft_s=0.02 if n <= 8 else 0.10, gap_s=0.03, n_tokens=4)

    with FakeOpenAI(plan) as fake:
        doc = run_bench(_cfg(fake.url))
    (step,) = doc["steps"]
    counts = (step["n_ok"], step["n_failed"], step["output_tokens"], step["tokens_from_usage"])
    assert counts == (10, 0, 40, 10)
    ttft, tpot, e2e = step["ttft_s"], step["tpot_s"], step["e2e_s"]
    assert _near(ttft["p50"], 0.02), ttft
    assert _near(ttft["p90"], 0.10) and _near(ttft["p99"], 0.10), ttft  # linear interpolation: rank 8.1
    assert _near(tpot["p50"], 0.03) and _near(tpot["p90"], 0.03), tpot
    assert _near(e2e["p50"], 0.02 + 3 * 0.03), e2e
    assert _near(e2e["p90"], 0.10 + 3 * 0.03), e2e
    assert step["requests_per_s"] == pytest.approx(10 / step["window_s"])
    assert doc["failed_requests"] == 0 and doc["targets"][0]["model_id"] == "fake-model"
    sent = fake.arrivals[0].body
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}
    assert sent["model"] == "fake-model" and sent["max_tokens"] == 4 and sent["temperature"] == 0


def test_failures_counted_by_status_and_a_hang_times_out() -> None:
    def plan(n: int) -> Behaviour:
        if n == 3:
            return Behaviour(hang=True)
        if n % 5 == 0:
            return Behaviour(status=500)
        if n % 7 == 0:
            return Behaviour(status=503)
        return Behaviour(ttft_s=0.02, gap_s=0.02, usage=n % 2 == 0)

    with FakeOpenAI(plan) as fake:
        doc = run_bench(_cfg(fake.url, concurrency=(2,), requests=12, timeout_s=0.5))
    (step,) = doc["steps"]
    assert step["failed_by_status"] == {"500": 2, "503": 1}  # arrivals 5, 10 and 7
    assert (step["n_timeouts"], step["n_transport_errors"], step["n_stream_errors"]) == (1, 0, 0)
    assert (step["n_ok"], step["n_failed"]) == (8, 4)
    assert step["tokens_from_usage"] < step["n_ok"] and step["output_tokens"] == 8 * 4  # deltas counted too
    (hung,) = [r for r in step["requests"] if r["error"] == "timeout"]
    assert 0.5 - SLACK_S <= hung["end_s"] - hung["start_s"] < 1.5 and hung["status"] is None
    assert doc["failed_requests"] == 4


def test_cli_json_report_and_exit_status(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bench.json"
    args = ["--concurrency", "1,2", "--requests", "4", "--warmup", "1", "--prompt-lengths", "fixed:8",
            "--max-tokens", "fixed:3", "--timeout", "2"]
    with FakeOpenAI(lambda n: Behaviour(status=503) if n == 4 else Behaviour()) as fake:
        assert main(["bench", "http", "--url", fake.url, *args, "--json", str(out)]) == 1
    text = capsys.readouterr().out
    assert "e2e p50/p90/p99 ms" in text and "503:1" in text
    doc = json.loads(out.read_text())
    assert doc["schema"] == "edge-bench-http" and doc["schema_version"] == 1
    steps = [(s["target"], s["concurrency"], s["n_warmup"], s["n_measured"]) for s in doc["steps"]]
    assert steps == [("url", 1, 1, 4), ("url", 2, 1, 4)]
    assert doc["targets"][0]["is_edge"] is True and len(doc["timeline"]["url"]) >= 1
    assert doc["timeline"]["url"][0]["temp_c"] is not None
    assert doc["settings"]["concurrency"] == [1, 2] and doc["settings"]["seed"] == 0

    with FakeOpenAI() as fake:
        assert main(["bench", "http", "--url", fake.url, *args, "--json", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["failed_requests"] == 0  # stdout holds only the JSON

    rep = tmp_path / "rep"
    assert main(["report", "--bench", str(out), "--out", str(rep)]) == 0
    md = (rep / "report.md").read_text()
    assert "fake-model" in md
    for name in ("throughput.png", "latency.png", "thermal.png"):
        assert f"]({name})" in md
        assert (rep / name).read_bytes().startswith(PNG_SIGNATURE)


def test_compare_runs_interleaved_and_reports_ratios() -> None:
    slow, fast = FakeOpenAI(lambda n: Behaviour(ttft_s=0.08)), FakeOpenAI(lambda n: Behaviour(ttft_s=0.02))
    with slow, fast:
        doc = run_bench(_cfg(slow.url, compare=(TargetSpec("url", "fast", fast.url),), concurrency=(1, 2),
                             requests=3))
        order = sorted([(a.t_s, "url") for a in slow.arrivals] + [(a.t_s, "fast") for a in fast.arrivals])
    assert [(s["target"], s["concurrency"]) for s in doc["steps"]] == [
        ("url", 1), ("fast", 1), ("url", 2), ("fast", 2)]
    runs = [label for i, (_, label) in enumerate(order) if i == 0 or order[i - 1][1] != label]
    assert runs == ["url", "fast", "url", "fast"]  # C=1 on A, C=1 on B, C=2 on A, C=2 on B
    for r in doc["compare"]:
        assert r["baseline"] == "url" and r["target"] == "fast"
        assert r["ttft_s_p50"] < 0.6  # ~20 ms against ~80 ms
    assert doc["timeline"] == {"url": doc["timeline"]["url"], "fast": doc["timeline"]["fast"]}


def test_settle_pauses_before_every_step() -> None:
    a, b = FakeOpenAI(lambda n: Behaviour(ttft_s=0.01)), FakeOpenAI(lambda n: Behaviour(ttft_s=0.01))
    pauses: list[float] = []

    async def fake_sleep(s: float) -> None:
        pauses.append(s)

    with a, b:
        doc = run_bench(_cfg(a.url, compare=(TargetSpec("url", "b", b.url),), concurrency=(1, 2), requests=2,
                             settle_s=8.0), sleep=fake_sleep)
    assert len(doc["steps"]) == 4
    assert pauses == [8.0] * 4  # the servers' start, then each step's load, go idle first
    assert doc["settings"]["settle_s"] == 8.0


def test_a_launched_target_is_stopped_by_pid(tmp_path: Path) -> None:
    procs: list[subprocess.Popen[bytes]] = []
    script = Path(__file__).with_name("fake_openai.py")

    def launcher(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
        assert cmd[1:4] == ["-m", "edge.cli", "serve"] and "127.0.0.1" in cmd
        port = cmd[cmd.index("--port") + 1]
        with log.open("w") as f:
            procs.append(subprocess.Popen([sys.executable, str(script), "--port", port], stdout=f,
                                          stderr=subprocess.STDOUT))
        return procs[-1]

    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    cfg = BenchConfig(primary=TargetSpec("edge", "edge"), model_path=model, concurrency=(1,), requests=2,
                      warmup=0, prompt_lengths="fixed:4", max_tokens="fixed:2", timeout_s=5.0)
    try:
        doc = run_bench(cfg, launcher=launcher, ready_timeout_s=30.0)
    finally:
        for p in procs:  # only if the bench failed to; by PID
            if p.poll() is None:
                p.kill()
                p.wait(5)
    assert doc["targets"][0]["launched"] is True and doc["steps"][0]["n_ok"] == 2
    assert procs[0].returncode is not None and procs[0].returncode != 0  # ended by SIGTERM
