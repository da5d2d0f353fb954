"""`edge bench engine`'s baselines run as their own processes with the user's own environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from edge.tools import bench

LLAMA_BENCH_JSON = json.dumps([
    {"n_prompt": 512, "n_gen": 0, "n_threads": 2, "avg_ts": 247.5},
    {"n_prompt": 0, "n_gen": 128, "n_threads": 2, "avg_ts": 105.25},
])


def test_bare_loop_is_a_separate_script_that_imports_nothing_from_edge() -> None:
    argvs: list[list[str]] = []

    def runner(argv: list[str]) -> str:
        argvs.append(argv)
        return 'llama log noise\n{"tok_s": 118.5, "threads": 2, "seqs": 4, "tokens": 64}\n'

    assert bench.bare_decode("m.gguf", 64, 2, 4, runner=runner) == 118.5
    argv = argvs[0]
    assert argv[0] == sys.executable and Path(argv[1]) == bench.BARE_LOOP  # by path: no edge package init
    assert argv[argv.index("--threads") + 1] == "2" and argv[argv.index("--seqs") + 1] == "4"
    imports = [ln for ln in bench.BARE_LOOP.read_text().splitlines() if ln.startswith(("import ", "from "))]
    assert imports and not any(" edge" in ln for ln in imports)


def test_llama_bench_figures_are_read_from_its_json(tmp_path: Path) -> None:
    seen: list[list[str]] = []

    def runner(argv: list[str]) -> str:
        seen.append(argv)
        return LLAMA_BENCH_JSON

    pp, tg = bench.llama_bench(tmp_path / "llama-bench", "m.gguf", 2, runner=runner)
    assert (pp, tg) == (247.5, 105.25)
    argv = seen[0]
    assert argv[argv.index("-t") + 1] == "2" and argv[argv.index("-p") + 1] == "512"
    assert argv[argv.index("-b") + 1] == "512" and argv[argv.index("-o") + 1] == "json"


def test_children_get_the_environment_the_user_set_not_edges_wait_policy() -> None:
    probe = (
        "import os, edge.runtime, edge.runtime.llama.threads as t\n"
        "print(os.environ.get('OMP_WAIT_POLICY'), t.user_env().get('OMP_WAIT_POLICY'))\n"
    )
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    out = subprocess.run([sys.executable, "-c", probe], env={**base, "EDGE_THREAD_WAIT": "passive"},
                         capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["passive", "None"]  # edge's own process waits passively; a baseline not
    out = subprocess.run([sys.executable, "-c", probe], env={**base, "OMP_WAIT_POLICY": "active"},
                         capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["active", "active"]  # the user's own choice reaches both


def test_the_report_splits_a_step_into_decode_sampling_loop_and_delivery() -> None:
    split = {"step": 12.0, "llama_decode": 10.5, "sampling": 0.4, "loop": 0.6, "delivery": 0.5, "bare": 11.0}
    report = bench.BenchReport(
        model="m.gguf", n_threads=2, n_tokens=128, bare_tok_s=90.9, engine_tok_s=83.3, engine_vs_bare=0.916,
        multi_tok_s=120.0, multi_vs_single=1.44, bare_multi_vs_single=1.5, ttft_first_s=0.4,
        ttft_second_s=0.05, ttft_ratio=0.125, history_tokens=900, cached_tokens=880, overhead_share=0.09,
        sample_share=0.03, prefill_tok_s=300.0, step_split_ms=split)
    line = next(ln for ln in report.table().splitlines() if "one step" in ln)
    assert "12.00" in line and "llama_decode 10.50" in line and "sampling 0.40" in line
    assert "step loop (Python) 0.60" in line and "delivery and wake-ups 0.50" in line
    assert "bare loop 11.00" in line
    assert report.to_dict()["step_split_ms"] == split
