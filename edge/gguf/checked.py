"""Files already validated, kept across starts: a start must not re-walk a vocabulary it checked.

`validate_gguf` walks every token string of a model's vocabulary (its tokens must be unique, or
llama.cpp's loader aborts the process): 0.05 s of Python for SmolLM2's 49k tokens and 0.16 s for
Gemma 3's 262k, on the GIL while the weights load beside it. The facts it returns depend only on
the file's bytes and on the checks this edge runs, so they are kept in edge's cache directory
under a key of the file's identity (path, device, inode, size, mtime and ctime: a rewrite, a
replacement or a `touch` changes it) and `CHECKS_VERSION`. A later start with the same key reads
the facts back (JSON, a few KiB); anything else validates anew. Best effort both ways: an
unreadable or foreign entry is ignored, an unwritable directory only means checking again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edge.dirs import cache_dir
from edge.gguf.info import GGUFInfo, TensorInfo
from edge.gguf.reader import GGUFArray, SkippedString

log = logging.getLogger("edge.gguf")

# Bump when validate_gguf checks more, or GGUFInfo changes shape: every kept verdict is then stale.
CHECKS_VERSION = 1
KEEP_FILES_MAX = 64  # a store's worth; the oldest entries go first


def identity_key(path: Path, st: os.stat_result) -> str:
    parts = (CHECKS_VERSION, str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:32]


def _encode(v: Any) -> Any:
    if isinstance(v, GGUFArray):
        return {"__array__": [v.elem_type, v.count, None if v.values is None else list(v.values)]}
    if isinstance(v, SkippedString):
        return {"__skipped__": v.n_bytes}
    if isinstance(v, TensorInfo):
        return {"__tensor__": [v.name, v.ggml_type, list(v.shape), v.n_bytes, v.offset, v.layer]}
    raise TypeError(f"cannot keep a {type(v).__name__}")


def _decode(d: dict[str, Any]) -> Any:
    if "__array__" in d:
        kind, count, values = d["__array__"]
        return GGUFArray(kind, count, None if values is None else tuple(values))
    if "__skipped__" in d:
        return SkippedString(d["__skipped__"])
    if "__tensor__" in d:
        name, kind, shape, n_bytes, offset, layer = d["__tensor__"]
        return TensorInfo(name, kind, tuple(shape), n_bytes, offset, layer)
    return d


def to_text(info: GGUFInfo) -> str:
    fields = {f.name: getattr(info, f.name) for f in dataclasses.fields(info)}
    fields["metadata"] = dict(info.metadata)
    fields["quant_mix"] = dict(info.quant_mix)
    return json.dumps({"version": CHECKS_VERSION, "info": fields}, default=_encode, allow_nan=True)


def from_text(text: str) -> GGUFInfo | None:
    """The facts `to_text` wrote, or None for anything else (another version, a damaged file)."""
    try:
        doc = json.loads(text, object_hook=_decode)
        if not isinstance(doc, dict) or doc.get("version") != CHECKS_VERSION:
            return None
        raw = doc["info"]
        # JSON gave lists where GGUFInfo holds tuples (shapes, per-layer counts, swa_layers)
        args = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()}
        return GGUFInfo(**args)
    except (ValueError, TypeError, KeyError):
        return None


class CheckedFiles:
    """`<root>/gguf-checked/<key>.json` per validated file (root: `cache_dir()` at use)."""

    def __init__(self, root: Callable[[], Path] = cache_dir) -> None:
        self._root = root

    @property
    def directory(self) -> Path:
        return self._root() / "gguf-checked"

    def load(self, key: str) -> GGUFInfo | None:
        try:
            text = (self.directory / f"{key}.json").read_text(encoding="utf-8")
        except OSError:
            return None
        return from_text(text)

    def save(self, key: str, info: GGUFInfo) -> None:
        d = self.directory
        try:
            d.mkdir(parents=True, exist_ok=True)
            tmp = d / f".{key}.{os.getpid()}.tmp"
            tmp.write_text(to_text(info), encoding="utf-8")
            tmp.replace(d / f"{key}.json")
            self._prune(d)
        except (OSError, TypeError, ValueError) as exc:
            log.debug("validation of %s not kept (%s): checked again next start", info.path, exc)

    @staticmethod
    def _prune(d: Path) -> None:
        entries = sorted(d.glob("*.json"), key=lambda p: p.stat().st_mtime_ns)
        for p in entries[: max(0, len(entries) - KEEP_FILES_MAX)]:
            p.unlink(missing_ok=True)
