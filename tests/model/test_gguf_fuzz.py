"""1,000 seeded mutants of a catalog GGUF through the validator and `edge inspect` (issue 34).

Header, metadata and tensor table fields overwritten with boundary values, flipped bytes and
truncations (tests/gguf_mutator.py), run in a child under a watchdog (tests/gguf_fuzz.py): no
crash, no hang, every rejected file named with a one-line reason, every accepted one consistent.
`-s` prints the summary; EDGE_FUZZ_CASES and EDGE_FUZZ_SEED run a longer or another campaign, and
`python -m tests.gguf_fuzz MODEL --seed S --first CASE --cases 1` reruns one case.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.gguf_fuzz import run_campaign

pytestmark = pytest.mark.model

CASES = int(os.environ.get("EDGE_FUZZ_CASES", "1000"))
SEED = int(os.environ.get("EDGE_FUZZ_SEED", "34"))


def test_mutants_of_a_catalog_model_are_refused_with_a_reason_or_accepted_sane(
    smollm2_path: Path, tmp_path: Path
) -> None:
    report = run_campaign(smollm2_path, tmp_path, cases=CASES, seed=SEED)
    print("\n" + report.summary())
    assert not report.failures, "\n\n".join(report.failures[:5]) + "\n\n" + report.summary()
    assert report.cases == CASES
    # the mutations bite: every family ran, most were refused, for many different reasons
    assert {"header", "kv", "tensor", "blind", "stacked"} <= set(report.kinds), report.kinds
    assert report.outcomes["rejected"] >= 0.6 * CASES, report.summary()
    assert len(report.reasons) >= min(30, CASES // 20), report.summary()
    assert report.inspected >= report.outcomes["accepted"] + report.outcomes["rejected"] // 5 - 1
