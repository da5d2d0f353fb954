"""Percentiles, per-step figures and the knee on hand-made data (exact values)."""

from __future__ import annotations

import pytest

from edge.bench.stats import RequestResult, StepStats, find_knee, percentiles, ratios, summarize


def test_percentiles_use_linear_interpolation() -> None:
    assert percentiles([1, 2, 3, 4]) == pytest.approx({"p50": 2.5, "p90": 3.7, "p99": 3.97})
    assert percentiles(range(1, 11)) == pytest.approx({"p50": 5.5, "p90": 9.1, "p99": 9.91})
    assert percentiles([4, 1, 3, 2]) == percentiles([1, 2, 3, 4])  # order does not matter
    assert percentiles([7.0]) == {"p50": 7.0, "p90": 7.0, "p99": 7.0}


def test_percentiles_of_nothing_are_none() -> None:
    assert percentiles([]) == {"p50": None, "p90": None, "p99": None}


def _r(i: int, start: float, end: float, ttft: float | None = None, n_out: int = 0, *, warmup: bool = False,
       error: str | None = None, status: int | None = 200, usage: bool = True) -> RequestResult:
    return RequestResult(i, warmup, start, end, ttft, n_out, usage, status, error, "")


def test_summarize_excludes_warmup_and_counts_failures_by_kind() -> None:
    results = [
        _r(0, 0.0, 5.0, 4.0, 3, warmup=True),  # slow warmup: must not show in any figure
        _r(1, 0.0, 0.0, None, 0, warmup=True, error="http", status=503),
        _r(2, 1.0, 2.0, 0.2, 9),  # tpot (1.0 - 0.2) / 8 = 0.1
        _r(3, 1.5, 2.5, 0.4, 5),  # tpot (1.0 - 0.4) / 4 = 0.15
        _r(4, 2.0, 4.0, 0.6, 3, usage=False),  # tpot (2.0 - 0.6) / 2 = 0.7
        _r(5, 2.5, 3.0, None, 0, error="http", status=500),
        _r(6, 2.6, 3.1, None, 0, error="http", status=500),
        _r(7, 2.7, 3.2, None, 0, error="http", status=503),
        _r(8, 3.0, 5.0, None, 0, error="timeout", status=None),
        _r(9, 3.0, 3.1, None, 0, error="transport", status=None),
        _r(10, 3.0, 3.3, 0.1, 1, error="stream"),
        _r(11, 3.0, 3.2, None, 0, error="empty"),
    ]
    s = summarize("a", 2, results, started_s=10.0, ended_s=15.0)
    assert (s.n_sent, s.n_warmup, s.n_measured, s.n_ok, s.n_failed) == (12, 2, 10, 3, 7)
    assert s.failed_by_status == {"500": 2, "503": 1}
    assert (s.n_timeouts, s.n_transport_errors, s.n_stream_errors, s.n_empty) == (1, 1, 1, 1)
    assert s.n_warmup_failed == 1
    assert s.window_s == pytest.approx(4.0)  # first measured start 1.0 -> last measured end 5.0
    assert s.requests_per_s == pytest.approx(3 / 4.0)
    assert s.output_tokens == 17
    assert s.output_tokens_per_s == pytest.approx(17 / 4.0)
    assert s.tokens_from_usage == 2
    assert s.ttft_s == pytest.approx({"p50": 0.4, "p90": 0.56, "p99": 0.596})
    assert s.e2e_s == pytest.approx({"p50": 1.0, "p90": 1.8, "p99": 1.98})
    assert s.tpot_s == pytest.approx({"p50": 0.15, "p90": 0.59, "p99": 0.689})
    assert (s.started_s, s.ended_s) == (10.0, 15.0)
    assert any(e.startswith("timeout") for e in s.errors_sample)


def test_tpot_needs_two_tokens() -> None:
    assert _r(0, 0.0, 1.0, 0.5, 1).tpot_s is None
    assert _r(0, 0.0, 1.0, None, 5).tpot_s is None
    assert _r(0, 0.0, 1.0, 0.5, 2).tpot_s == pytest.approx(0.5)


def test_a_step_of_only_failures_has_no_latency() -> None:
    s = summarize("a", 1, [_r(0, 0.0, 1.0, None, 0, error="http", status=500)])
    assert s.n_ok == 0 and s.requests_per_s == 0.0
    assert s.e2e_s == {"p50": None, "p90": None, "p99": None}


def _step(c: int, tok_s: float, e2e_p90: float, ttft_p90: float = 0.1) -> StepStats:
    pct = {"p50": None, "p90": None, "p99": None}
    return StepStats(
        target="a", concurrency=c, n_sent=1, n_warmup=0, n_measured=1, n_ok=1, n_failed=0,
        failed_by_status={}, n_timeouts=0, n_transport_errors=0, n_stream_errors=0, n_empty=0,
        n_warmup_failed=0,
        window_s=1.0, requests_per_s=tok_s / 10, output_tokens_per_s=tok_s, output_tokens=int(tok_s),
        tokens_from_usage=1, ttft_s={**pct, "p50": ttft_p90 / 2, "p90": ttft_p90},
        tpot_s=dict(pct), e2e_s={**pct, "p50": e2e_p90 / 2, "p90": e2e_p90},
    )


def test_knee_is_the_step_before_throughput_flattens_while_latency_climbs() -> None:
    steps = [_step(1, 100, 1.0), _step(2, 190, 1.05), _step(4, 200, 1.5), _step(8, 201, 3.0)]
    assert find_knee(steps) == 2
    assert find_knee(list(reversed(steps))) == 2  # the ladder is sorted by concurrency first


def test_knee_from_ttft_alone() -> None:
    steps = [_step(1, 100, 1.0, ttft_p90=0.1), _step(2, 105, 1.1, ttft_p90=0.2)]
    assert find_knee(steps) == 1


def test_no_knee_while_throughput_rises_or_latency_holds() -> None:
    assert find_knee([_step(1, 100, 1.0), _step(2, 180, 2.0), _step(4, 300, 4.0)]) is None
    assert find_knee([_step(1, 100, 1.0), _step(2, 100, 1.1), _step(4, 101, 1.2)]) is None
    assert find_knee([_step(1, 100, 1.0)]) is None
    assert find_knee([]) is None


def test_knee_thresholds_are_strict() -> None:
    # exactly +10 % throughput is still rising; exactly +25 % latency is not yet climbing
    assert find_knee([_step(1, 100, 1.0), _step(2, 110, 2.0)]) is None
    assert find_knee([_step(1, 100, 1.0), _step(2, 100, 1.25)]) is None
    assert find_knee([_step(1, 100, 1.0), _step(2, 109, 1.26)]) == 1


def test_ratios_are_other_over_base() -> None:
    a, b = _step(1, 100, 1.0), _step(1, 150, 0.5)
    r = ratios(a, b)
    assert r["output_tokens_per_s"] == pytest.approx(1.5)
    assert r["requests_per_s"] == pytest.approx(1.5)
    assert r["e2e_s_p90"] == pytest.approx(0.5)
    assert r["tpot_s_p50"] is None  # no data on either side
