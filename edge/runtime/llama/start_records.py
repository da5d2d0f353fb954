"""What a start of `edge serve` leaves for the next one (early.py): records in the cache directory
(`starts/`), one JSON file each, written whole (a temporary file renamed) so that two servers
starting at once never read half a record.

- `<key>.json`, a command line's (`start_key`): the loads it made, each with its context
  configuration and chat head;
- `files/<key>.json`, a model file's (`file_key`): that load as the last start of any command line
  made it, for a command line never run that names the file;
- `names/<key>.json`, a model name's (`name_key`): the file a name given on the command line (or
  none: the default model) resolved to, in that directory with those settings.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("edge.engine")

RECORD_VERSION = 1


@dataclass(frozen=True)
class Weights:
    """One model load as `Residency.open` asks for it, and the file it found there."""

    path: str
    n_gpu_layers: int
    file_id: tuple[int, int, int, int]  # model.file_identity: replaced files never match
    context: dict[str, Any] | None = None  # the ContextConfig made on them (asdict), if any
    head: tuple[int, ...] = ()  # the chat template's head, primed into that context (prime.py)


def _digest(blob: object) -> str:
    return hashlib.sha256(json.dumps(blob, separators=(",", ":")).encode()).hexdigest()[:32]


def _edge_env(env: dict[str, str]) -> list[tuple[str, str]]:
    return sorted((k, v) for k, v in env.items() if k.startswith("EDGE_"))


def start_key(argv: Sequence[str], cwd: str, env: dict[str, str], exe: str = sys.executable) -> str:
    """What must be the same for the last start's loads to be this one's: the command line, where
    it runs, the `EDGE_*` settings and the interpreter (hence the installed edge)."""
    return _digest([list(argv), cwd, _edge_env(env), exe])


def file_key(path: str, file_id: tuple[int, int, int, int]) -> str:
    """The record of one model file as last loaded, by any command line."""
    return "files/" + _digest(["file", path, list(file_id)])


def name_key(name: str | None, cwd: str, env: dict[str, str], exe: str = sys.executable) -> str:
    """The record of the file a model name (None: the default model) resolved to: the store and
    the default depend on the directory, the settings and the installed edge, as a start does."""
    return "names/" + _digest(["name", name, cwd, _edge_env(env), exe])


def gguf_words(argv: Sequence[str], cwd: str) -> list[str]:
    """The existing `.gguf` files that `argv` names (`--flag=FILE` too), as the host resolves a
    path given on the command line (host/names.py: symbolic links resolved), in order, once each."""
    paths: list[str] = []
    for word in argv:
        word = word.split("=", 1)[-1]
        if word.lower().endswith(".gguf"):
            path = os.path.realpath(os.path.join(cwd, os.path.expanduser(word)))
            if os.path.isfile(path) and path not in paths:
                paths.append(path)
    return paths


def read_record(root: Path, key: str) -> list[Weights]:
    """The loads recorded under `key`; [] for none yet, another version, or an unreadable one."""
    try:
        data = json.loads((root / f"{key}.json").read_text())
        if data.get("version") != RECORD_VERSION:
            return []
        return [Weights(m["path"], int(m["n_gpu_layers"]), tuple(m["file_id"]), m.get("context"),
                        tuple(int(t) for t in m.get("head", ())))
                for m in data["models"]]
    except (OSError, ValueError, KeyError, TypeError):
        return []  # the start records anew


def write_record(root: Path, key: str, loads: list[Weights]) -> None:
    """Record `loads` under `key`, whole, unless it is so already; a failure is only logged."""
    if read_record(root, key) == loads:
        return
    body = {"version": RECORD_VERSION, "models": [
        {"path": w.path, "n_gpu_layers": w.n_gpu_layers, "file_id": list(w.file_id), "context": w.context,
         "head": list(w.head)} for w in loads]}
    path = root / f"{key}.json"
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(body))
        os.replace(tmp, path)  # two servers starting at once each leave a whole record
    except OSError as exc:
        log.debug("start record not written: %s", exc)
