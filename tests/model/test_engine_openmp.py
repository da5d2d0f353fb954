"""The OpenMP wait policy must be in the environment before llama_cpp loads (see model.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.model

PROBE = (
    "import os, sys\n"
    "import edge.runtime\n"
    "assert 'llama_cpp' not in sys.modules, 'llama_cpp loaded before the policy was set'\n"
    "import edge.runtime.engine\n"
    "print(os.environ['OMP_WAIT_POLICY'])\n"
)


@pytest.mark.parametrize(("given", "expected"), [(None, "passive"), ("active", "active")])
def test_passive_wait_policy_is_the_overridable_default(given: str | None, expected: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if given is not None:
        env["OMP_WAIT_POLICY"] = given
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == expected
