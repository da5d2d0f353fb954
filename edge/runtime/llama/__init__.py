"""llama.cpp bindings: the one room of the runtime that imports `llama_cpp`.

OpenMP reads its thread-wait policy once, when llama_cpp loads its native libraries, so this
package sets it (threads.py) before the import; every other room takes `llama_cpp` from here
(`from edge.runtime.llama import llama_cpp`), which keeps that order whatever imports first.
"""

from __future__ import annotations

from edge.runtime.llama.threads import apply_wait_policy

WAIT_POLICY = apply_wait_policy()

import llama_cpp  # noqa: E402

__all__ = ["WAIT_POLICY", "llama_cpp"]
