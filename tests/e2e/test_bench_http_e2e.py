"""`edge bench http` and `edge report` against a live edge server with the real SmolLM2 model."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from edge.cli import main

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SMALL = ["--concurrency", "1,2", "--requests", "3", "--warmup", "1", "--prompt-lengths", "uniform:8-24",
         "--max-tokens", "fixed:8", "--timeout", "120"]


def test_bench_and_report_against_a_live_server(start_server: Callable[..., Any], smollm2_path: Path,
                                                 tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    server = start_server(smollm2_path, "--slots", "2", "--ctx", "1024", "--threads", "1")
    bench = tmp_path / "bench.json"
    assert main(["bench", "http", "--url", server.url, *SMALL, "--json", str(bench)]) == 0
    table = capsys.readouterr().out
    assert re.search(r"^url\s+2\s+3\s+0\s", table, re.MULTILINE), table
    doc = json.loads(bench.read_text())
    assert doc["targets"][0]["is_edge"] is True
    model_id = doc["targets"][0]["model_id"]
    assert model_id
    for step in doc["steps"]:
        assert (step["n_ok"], step["n_failed"], step["n_warmup"]) == (3, 0, 1)
        assert step["tokens_from_usage"] == 3  # edge sends the usage chunk when asked
        assert 3 <= step["output_tokens"] <= 3 * 8
        ttft, e2e = step["ttft_s"], step["e2e_s"]
        assert 0 < ttft["p50"] <= ttft["p90"] <= ttft["p99"] <= e2e["p99"]
        assert step["output_tokens_per_s"] > 0
    points = doc["timeline"]["url"]
    assert points and all("error" not in p for p in points)
    assert points[0]["mode"] is not None and points[0]["knobs"]["n_threads"] == 1

    out = tmp_path / "report"
    assert main(["report", str(smollm2_path), "--bench", str(bench), "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    assert model_id in md and "SmolLM2" in md  # the served id and the GGUF's own name
    assert "## Memory plan" in md and "fits" in json.loads((out / "facts.json").read_text())["plan"]
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    assert {"throughput.png", "latency.png", "thermal.png"} <= set(images)
    for name in images:
        data = (out / name).read_bytes()
        assert len(data) > 1000 and data.startswith(PNG_SIGNATURE), name
    assert json.loads((out / "bench.json").read_text()) == doc


def test_bench_starts_and_stops_edge_itself(smollm2_path: Path, tmp_path: Path) -> None:
    bench = tmp_path / "bench.json"
    args = ["bench", "http", str(smollm2_path), "--threads", "1", "--slots", "1", "--ctx", "512",
            "--concurrency", "1", "--requests", "2", "--warmup", "0", "--prompt-lengths", "fixed:8",
            "--max-tokens", "fixed:4", "--json", str(bench)]
    assert main(args) == 0
    doc = json.loads(bench.read_text())
    (target,) = doc["targets"]
    assert target["launched"] is True and target["kind"] == "edge" and target["is_edge"] is True
    assert "--threads" in target["command"] and doc["steps"][0]["n_ok"] == 2
    with pytest.raises(httpx.HTTPError):  # stopped by PID once the ladder was done
        httpx.get(target["url"] + "/health", timeout=2.0)


def test_slots_sweep_recommends_a_setting_on_the_catalog_model(smollm2_path: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    bench = tmp_path / "sweep.json"
    args = ["bench", "http", str(smollm2_path), "--slots-sweep", "1,2", "--concurrency", "1,2",
            "--requests", "4", "--warmup", "1", "--prompt-lengths", "uniform:8-24",
            "--max-tokens", "fixed:16", "--ctx", "1024", "--timeout", "120",
            "--target-p90-ttft-ms", "30000", "--json", str(bench)]
    assert main(args) == 0
    printed = capsys.readouterr().out
    doc = json.loads(bench.read_text())
    # one server per setting, each started with its own --slots and stopped once its ladder was done
    assert [t["label"] for t in doc["targets"]] == ["slots=1", "slots=2"]
    for t, slots in zip(doc["targets"], ("1", "2"), strict=True):
        assert t["command"][t["command"].index("--slots") + 1] == slots and t["is_edge"] is True
        assert "smollm2" in t["model_id"].lower()
        with pytest.raises(httpx.HTTPError):
            httpx.get(t["url"] + "/health", timeout=2.0)
    assert len(doc["steps"]) == 4 and all(s["n_ok"] == 4 for s in doc["steps"])
    rec = doc["sweep"]["recommendation"]
    assert rec["slots"] in {1, 2} and rec["concurrency"] in {1, 2} and rec["met_target"] is True
    assert rec["output_tokens_per_s"] > 0 and 0 < rec["p90_ttft_ms"] <= 30000 and rec["max_queue"] >= 0
    assert f"recommended: --slots {rec['slots']} --max-queue {rec['max_queue']}" in printed

    out = tmp_path / "report"
    assert main(["report", "--bench", str(bench), "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    assert "## Slots sweep" in md and "(sweep.png)" in md
    assert (out / "sweep.png").read_bytes().startswith(PNG_SIGNATURE)
