"""Shared fixtures: real models pulled once into a cache, shared across runs.

Model tests never skip for a missing model: `edge pull` fetches it (as CI does),
and a failure to fetch is a test failure.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# verdicts edge caches per device (runtime/attention.py) go to a directory of this test session's
# own, inherited by the servers the end-to-end tests start, never to the user's cache
os.environ.setdefault("EDGE_CACHE_DIR", tempfile.mkdtemp(prefix="edge-test-cache-"))
# and the deployment records `edge serve` writes at every start (commands/deployments.py) likewise
os.environ.setdefault("EDGE_STATE_DIR", tempfile.mkdtemp(prefix="edge-test-state-"))
TEST_MODELS_DIR = Path(os.environ.get("EDGE_TEST_MODELS_DIR", REPO / ".cache" / "models"))


def _pulled(name: str) -> Path:
    from edge.store import ModelStore

    return ModelStore(TEST_MODELS_DIR).ensure(name)


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    return _pulled("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    return _pulled("gemma3-270m")


@pytest.fixture(scope="session")
def qwen_coder_path() -> Path:
    """Qwen2.5 Coder 0.5B Instruct: the catalog's smallest model whose template has tool calls."""
    return _pulled("qwen2.5-coder-0.5b-instruct")
