"""How llama.cpp's CPU worker threads wait between ops: the one place edge decides it.

OpenMP reads its wait policy once, when llama_cpp loads its native libraries, so
this must run before the first `import llama_cpp`; `edge/runtime/__init__.py`
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
    "passive: with OpenMP workers spinning at the barrier between ops, a 2-core box with one other "
    "busy process decoded SmolLM2-135M at 0.4-2.8 tok/s instead of ~25; passive gave 18-26 there."
)


def apply_wait_policy(env: MutableMapping[str, str] | None = None) -> str:
    """Set the OpenMP wait policy for this process unless the user did; returns what is in force."""
    env = os.environ if env is None else env
    if any(k in env for k in USER_KEYS):
        return "user:" + ",".join(f"{k}={env[k]}" for k in USER_KEYS if k in env)
    choice = env.get(ENV_POLICY, "passive").strip().lower()
    if choice == "passive":
        env["OMP_WAIT_POLICY"] = "passive"
    elif choice.startswith("spin:") and choice[5:].isdigit():
        env["GOMP_SPINCOUNT"] = choice[5:]
    else:
        choice = "default"
    return choice
