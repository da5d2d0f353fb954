"""The slots sweep: `recommend()`'s rule, the merged document, its table, report and flags."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest

from edge.bench import report
from edge.bench.recommend import SweepPoint, max_queue_for, recommend
from edge.bench.runner import BenchConfig, document
from edge.bench.stats import RequestResult, summarize
from edge.bench.sweep import run_sweep
from edge.bench.table import render
from edge.bench.targets import TargetSpec
from edge.cli import main

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _p(slots: int, c: int, tok_s: float, p90_ms: float | None, req_s: float = 2.0,
       failed: int = 0) -> SweepPoint:
    return SweepPoint(slots, c, tok_s, req_s, p90_ms, failed)


# --- recommend() -----------------------------------------------------------------------


def test_the_most_tokens_per_second_within_the_target_wins() -> None:
    points = [_p(1, 1, 10, 100), _p(1, 2, 14, 450), _p(2, 2, 20, 300), _p(2, 4, 30, 900), _p(4, 4, 25, 480)]
    rec = recommend(points, 500)
    # 30 tok/s at slots 2 C 4 misses the target (900 ms); 25 tok/s at slots 4 is the best within it
    assert (rec.slots, rec.concurrency, rec.output_tokens_per_s, rec.met_target) == (4, 4, 25, True)
    assert rec.flags == f"--slots 4 --max-queue {rec.max_queue}"
    assert rec.to_json()["flags"] == rec.flags and rec.target_ms == 500


def test_ties_go_to_lower_p90_then_fewer_slots_then_lower_concurrency() -> None:
    assert recommend([_p(4, 4, 20, 300), _p(2, 4, 20, 200)], 500).slots == 2  # lower P90
    assert recommend([_p(4, 4, 20, 200), _p(2, 4, 20, 200)], 500).slots == 2  # fewer slots
    rec = recommend([_p(2, 8, 20, 200), _p(2, 4, 20, 200)], 500)
    assert (rec.slots, rec.concurrency) == (2, 4)  # lower concurrency
    assert recommend([_p(1, 1, 20, 500)], 500).met_target is True  # the target itself is within


def test_nothing_within_the_target_recommends_the_lowest_p90_marked() -> None:
    points = [_p(1, 1, 10, 800), _p(2, 2, 20, 700), _p(2, 4, 30, 1500), _p(4, 2, 25, 700)]
    rec = recommend(points, 500)
    assert rec.met_target is False
    # 700 ms twice: the one with more tokens/s
    assert (rec.slots, rec.concurrency, rec.p90_ttft_ms) == (4, 2, 700)
    assert rec.max_queue == 0  # no headroom, and C <= slots held nobody waiting


def test_one_setting_only() -> None:
    rec = recommend([_p(2, 1, 12, 150), _p(2, 2, 20, 260), _p(2, 4, 22, 620)], 300)
    assert (rec.slots, rec.concurrency, rec.met_target) == (2, 2, True)


def test_failed_or_empty_points_are_never_recommended() -> None:
    points = [_p(8, 8, 99, 100, failed=1), _p(4, 4, 50, None), _p(1, 1, 10, 200)]
    assert recommend(points, 500).slots == 1
    with pytest.raises(ValueError, match="no point"):
        recommend([_p(8, 8, 99, 100, failed=2), _p(4, 4, 0, None, req_s=0)], 500)


def test_max_queue_keeps_the_wait_within_the_headroom() -> None:
    # C=4 on 2 slots held 2 waiting; 600 ms of headroom at 3 req/s admits 1 more (1.8 floored)
    assert max_queue_for(_p(2, 4, 20, 400, req_s=3.0), 1000) == 3
    assert max_queue_for(_p(4, 2, 20, 100, req_s=5.0), 1000) == 4  # 0 waiting + 0.9 s x 5/s
    assert max_queue_for(_p(2, 8, 20, 900, req_s=2.0), 500) == 6  # over target: what was measured
    assert max_queue_for(_p(1, 1, 20, 0, req_s=2.0), 1500) == 3  # exact products are not floored down


# --- the sweep's document --------------------------------------------------------------


def _cfg(**kw: Any) -> BenchConfig:
    base: dict[str, Any] = dict(primary=TargetSpec("edge", "edge"), model="smol", model_path=Path("/m.gguf"),
                                concurrency=(1, 2), requests=3, warmup=0, slots_sweep=(1, 2),
                                target_p90_ttft_ms=500.0)
    return BenchConfig(**{**base, **kw})


def _run(cfg: BenchConfig) -> dict[str, Any]:
    """A finished run_bench document: more clients and more slots serve more tokens/s; TTFT is
    50 ms plus 150 ms per client and slot."""
    label = cfg.primary.label
    steps = []
    for c in cfg.concurrency:
        ttft = 0.15 * c / cfg.slots + 0.05
        rs = [RequestResult(i, False, i * 0.5 / c, i * 0.5 / c + 1.0 / cfg.slots, ttft, 16, True, 200)
              for i in range(3)]
        steps.append((summarize(label, c, rs, 2.0 * c, 2.0 * c + 1.5), rs))
    tl = [{"t_s": 0.5 * k, "temp_c": 50.0, "mode": "nominal", "budget": 1.0,
           "knobs": {"n_threads": 2, "duty": 1.0, "paused": False}} for k in range(8)]
    target = {"label": label, "kind": "edge", "url": "http://127.0.0.1:1", "model_id": "smol",
              "is_edge": True, "launched": True, "command": ["edge", "serve", "--slots", str(cfg.slots)]}
    return document(cfg, [target], steps, {label: tl}, dt.datetime(2026, 1, 2, tzinfo=dt.timezone.utc), 4.0)


def test_the_sweep_starts_one_server_per_setting_and_merges_the_runs() -> None:
    seen: list[tuple[int, str, tuple[int, ...]]] = []

    def run(cfg: BenchConfig, **kw: Any) -> dict[str, Any]:
        assert kw == {"progress": False}
        seen.append((cfg.slots, cfg.primary.label, cfg.slots_sweep))
        return _run(cfg)

    doc = run_sweep(_cfg(compare=()), run=run, progress=False)
    assert seen == [(1, "slots=1", ()), (2, "slots=2", ())]
    assert [t["label"] for t in doc["targets"]] == ["slots=1", "slots=2"]
    assert [(s["target"], s["concurrency"]) for s in doc["steps"]] == [
        ("slots=1", 1), ("slots=1", 2), ("slots=2", 1), ("slots=2", 2)]
    # the second run's clock starts where the first ended (4 s)
    assert doc["steps"][2]["started_s"] == pytest.approx(6.0) and doc["duration_s"] == 8.0
    assert doc["timeline"]["slots=2"][0]["t_s"] == pytest.approx(4.0)
    assert doc["settings"]["slots"] == 2 and doc["settings"]["slots_sweep"] == [1, 2]
    sweep = doc["sweep"]
    assert sweep["slots"] == [1, 2] and set(sweep["knee"]) == {"1", "2"} and len(sweep["points"]) == 4
    rec = sweep["recommendation"]
    # slots 1 C 2 is at 350 ms, slots 2 C 2 at 200 ms: both within, slots 2 serves more
    assert (rec["slots"], rec["concurrency"], rec["met_target"]) == (2, 2, True)
    assert json.loads(json.dumps(doc))["sweep"] == sweep  # --json writes it as it is


def test_table_and_report_show_the_recommendation_and_the_sweep_plot(tmp_path: Path) -> None:
    doc = run_sweep(_cfg(), run=lambda cfg, **kw: _run(cfg))
    text = render(doc)
    assert "slots sweep, target P90 TTFT <= 500 ms" in text
    assert f"recommended: {doc['sweep']['recommendation']['flags']}" in text
    assert "knee slots=1:" in text and "knee slots=2:" in text
    md = report.write(tmp_path, doc, {"edge_version": "x"}, "2026-01-02").read_text()
    assert "## Slots sweep" in md and "![Slots sweep" in md and "slots 1, 2 (one server per setting" in md
    data = (tmp_path / "sweep.png").read_bytes()
    assert len(data) > 1000 and data.startswith(PNG_SIGNATURE)


def test_a_sweep_that_misses_the_target_says_so() -> None:
    doc = run_sweep(_cfg(target_p90_ttft_ms=50.0), run=lambda cfg, **kw: _run(cfg))
    rec = doc["sweep"]["recommendation"]
    assert rec["met_target"] is False
    assert "NO POINT MET THE TARGET (P90 TTFT <= 50 ms)" in render(doc)


def test_a_plain_run_has_no_sweep_section(tmp_path: Path) -> None:
    doc = _run(dataclasses.replace(_cfg(), primary=TargetSpec("edge", "edge"), slots_sweep=()))
    assert "sweep" not in doc and "slots sweep" not in render(doc)
    assert not (tmp_path / "sweep.png").exists()


# --- the flags ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--url", "http://127.0.0.1:9", "--slots-sweep", "1,2", "--target-p90-ttft-ms", "500"],
         "cannot change its slots"),
        (["MODEL", "--slots-sweep", "1,2"], "give --target-p90-ttft-ms"),
        (["MODEL", "--target-p90-ttft-ms", "500"], "only with --slots-sweep"),
        (["MODEL", "--slots-sweep", "1,x", "--target-p90-ttft-ms", "500"], "integers like"),
        (["MODEL", "--slots-sweep", "0,2", "--target-p90-ttft-ms", "500"], "between 1 and 64"),
        (["MODEL", "--slots-sweep", "1,2", "--target-p90-ttft-ms", "0"], "must be positive"),
        (["MODEL", "--slots-sweep", "1,2", "--target-p90-ttft-ms", "500", "--compare", "edge"],
         "drop --compare"),
    ],
)
def test_sweep_usage_errors_exit_2(
    argv: list[str], needle: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")

    def launcher(cmd: list[str], log: Path) -> Any:
        raise AssertionError("a usage error starts no server")

    monkeypatch.setattr("edge.bench.targets.popen_launcher", launcher)
    argv = [str(model) if a == "MODEL" else a for a in argv]
    assert main(["bench", "http", *argv]) == 2
    assert needle in capsys.readouterr().err


def test_the_sweep_flags_reach_the_config(tmp_path: Path) -> None:
    from edge.cli import build_parser
    from edge.commands.bench import bench_config

    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    args = build_parser().parse_args(["bench", "http", str(model), "--slots-sweep", "4,1,2,2",
                                      "--target-p90-ttft-ms", "750"])
    cfg = bench_config(args)
    assert (cfg.slots_sweep, cfg.target_p90_ttft_ms) == ((1, 2, 4), 750.0)
