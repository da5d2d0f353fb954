"""What edge measures on this device (attention kind, verify-step costs), kept across starts.

A probe decodes for a second or more on a small CPU, and its answer depends only on the model
file, the llama.cpp build (with the CPU features it reports) and the thread count. So each
answer is stored under a key of exactly those (plus what the probe itself varies), one JSON
file per kind of probe in edge's cache directory (`EDGE_CACHE_DIR`, else the user cache), and
a later start or reload with the same key reads it instead of measuring. Writing is best
effort: a read-only home only means measuring again.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from edge.dirs import cache_dir

log = logging.getLogger("edge.engine")


@functools.lru_cache(maxsize=1)
def build_identity() -> str:
    """The installed llama.cpp build as a probe answer depends on it: bindings version, vendored
    commit and llama.cpp's system info (backends, CPU features)."""
    from edge.runtime.llama.backend import probe_backends
    from edge.runtime.llama.build import build_info

    info = build_info()
    return f"{info.llama_cpp_python}|{info.llama_cpp_commit}|{probe_backends().system_info}"


def probe_key(model_path: str, build: str, n_threads: int, *extra: object) -> str:
    """What an answer depends on: the model file (name, size, mtime), the build, the threads and
    `extra` (what the probe varies: verify length, attention kind, ...)."""
    st = os.stat(model_path)
    parts = [Path(model_path).name, st.st_size, int(st.st_mtime), build, n_threads, *extra]
    return hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()[:24]


class ProbeCache:
    """One kind of probe's answers, by key: `<root>/<kind>.json` (root: `cache_dir()` at use)."""

    def __init__(self, kind: str, root: Path | None = None) -> None:
        self.kind = kind
        self.root = root

    @property
    def path(self) -> Path:
        return (self.root or cache_dir()) / f"{self.kind}.json"

    def load(self, key: str) -> dict[str, Any] | None:
        """The answer kept under `key`, or None (none yet, or an unreadable file)."""
        try:
            row = json.loads(self.path.read_text()).get(key)
        except (OSError, ValueError, AttributeError):
            return None
        return row if isinstance(row, dict) else None

    def save(self, key: str, row: dict[str, Any]) -> None:
        """Keep `row` under `key` beside the other answers (atomic replace; best effort)."""
        path = self.path
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            doc = {}  # none yet, or unreadable: start over
        try:
            doc = doc if isinstance(doc, dict) else {}
            doc[key] = row
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(doc, indent=1, sort_keys=True))
            tmp.replace(path)
        except OSError as exc:
            log.info("%s answer not saved (%s): measured again next start", self.kind, exc)
