"""How llama.cpp's CPU worker threads wait between ops: the one place edge decides it.

OpenMP reads its wait policy once, when llama_cpp loads its native libraries, so
this must run before the first `import llama_cpp`; `edge/runtime/llama/__init__.py`
calls `apply_wait_policy()` first thing, and every module that imports llama_cpp
lives in this package. A user's own `OMP_WAIT_POLICY` (or `GOMP_SPINCOUNT`)
always wins.

WHY_DEFAULT below records the measurement the default rests on.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

ENV_POLICY = "EDGE_THREAD_WAIT"  # "default" (llama.cpp's own), "passive", or "spin:N" (GOMP_SPINCOUNT)
USER_KEYS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")

WHY_DEFAULT = (
    "llama.cpp's default (OpenMP workers spin at the barrier between ops). Measured with "
    "scripts/bench_thread_wait.py (2-core EPYC VM, SmolLM2-135M Q4_1, median of 3 x 128 tokens, "
    "tok/s): quiet, 2 threads: default 97, passive 32, GOMP_SPINCOUNT=10000 94; beside a niced busy "
    "process: 100 / 48 / 73; beside an equal-priority busy process: 30 / 43 / 17, but 1 thread "
    "with the default: 67. A build without OpenMP (ggml's threadpool, --poll 0/50/100) was no "
    "better: 105/94/95 quiet, 31/30/33 beside the equal-priority process. So no process-wide "
    "policy: the equal-priority case is visible as CPU contention (telemetry/cpu.py) and the "
    "scheduler decodes with the free cores (scheduler/contention.py)."
)


_BEFORE: dict[str, str | None] = {}  # the user's own values of USER_KEYS, before this module ran


def apply_wait_policy(env: MutableMapping[str, str] | None = None) -> str:
    """Set the OpenMP wait policy for this process unless the user did; returns what is in force."""
    env = os.environ if env is None else env
    if env is os.environ and not _BEFORE:
        _BEFORE.update({k: env.get(k) for k in USER_KEYS})
    if any(k in env for k in USER_KEYS):
        return "user:" + ",".join(f"{k}={env[k]}" for k in USER_KEYS if k in env)
    choice = env.get(ENV_POLICY, "default").strip().lower()
    if choice == "passive":
        env["OMP_WAIT_POLICY"] = "passive"
    elif choice.startswith("spin:") and choice[5:].isdigit():
        env["GOMP_SPINCOUNT"] = choice[5:]
    else:
        choice = "default"
    return choice


def user_env() -> dict[str, str]:
    """This process's environment as the user set it (without the wait policy edge may have
    added): what a baseline child process must get to measure llama.cpp's own behaviour."""
    env = dict(os.environ)
    for key, value in _BEFORE.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env
