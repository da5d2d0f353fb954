"""Where edge keeps what it can measure or check again: one rule for every cache that outlives a run."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """`EDGE_CACHE_DIR`, else the per-user cache directory (the probe answers, checked GGUF files)."""
    env = os.environ.get("EDGE_CACHE_DIR")
    if env:
        return Path(env)
    import platformdirs

    return Path(platformdirs.user_cache_dir("edge", appauthor=False))
