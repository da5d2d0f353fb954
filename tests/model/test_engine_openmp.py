"""The thread-wait policy is decided in one place (edge/runtime/llama/threads.py), before llama_cpp loads."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.model

PROBE = (
    "import os, sys\n"
    "before = dict(os.environ)\n"
    "import edge.runtime, edge.runtime.types\n"
    "assert 'llama_cpp' not in sys.modules, 'llama_cpp loaded before the policy was set'\n"
    "assert dict(os.environ) == before, 'importing edge.runtime changed the environment'\n"
    "import edge.runtime.engine.core\nimport edge.runtime.llama\n"
    "print(os.environ.get('OMP_WAIT_POLICY', '-'), os.environ.get('GOMP_SPINCOUNT', '-'),"
    " edge.runtime.llama.WAIT_POLICY)\n"
)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, "- - default"),  # llama.cpp's own default: no process-global wait policy
        ({"EDGE_THREAD_WAIT": "passive"}, "passive - passive"),
        ({"EDGE_THREAD_WAIT": "spin:10000"}, "- 10000 spin:10000"),
        ({"OMP_WAIT_POLICY": "active", "EDGE_THREAD_WAIT": "passive"},
         "active - user:OMP_WAIT_POLICY=active"),
    ],
)
def test_wait_policy_is_set_before_llama_cpp_loads_and_the_user_wins(env: dict[str, str],
                                                                       expected: str) -> None:
    base = {k: v for k, v in os.environ.items()
            if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "EDGE_THREAD_WAIT")}
    out = subprocess.run([sys.executable, "-c", PROBE], env={**base, **env}, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == expected
