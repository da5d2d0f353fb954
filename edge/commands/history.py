"""`edge history [--diff [A B]] [--json]`: the record of every `edge serve` start, and what changed.

Lists the deployment records (`commands/deployments.py`) oldest first, numbered; `--diff A B`
compares two of them (a number from the list, negative from the end, a record's file name or a
path; default: the last two) key by key: versions and build, models (sha256, quantization),
each setting's value and origin, the machine's summary. Exit status: 0, 2 when a record named
does not exist or fewer than two are there to compare.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, TextIO

from edge.commands._common import add_settings_args, settings_from_args
from edge.commands.deployments import VOLATILE, deployments_dir, load_records
from edge.errors import InvalidRequest


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("history", help="list the records of every `edge serve` start; diff two of them")
    p.add_argument("--diff", nargs="*", default=None, metavar="REC",
                   help="compare two records: numbers from the list (-1: the last), names or paths "
                        "(default: the last two)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--state-dir", type=Path, default=None, metavar="DIR",
                   help="where the records are (default: the user state dir; env EDGE_STATE_DIR)")
    add_settings_args(p)
    p.set_defaults(func=run)


def flatten(doc: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted keys to leaves; models keyed by role, settings as "value (from origin)"."""
    if isinstance(doc, dict):
        if set(doc) == {"value", "from"}:
            return {prefix: f"{json.dumps(doc['value'])} ({doc['from']})"}
        out: dict[str, Any] = {}
        for k, v in doc.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    if isinstance(doc, list) and doc and all(isinstance(m, dict) and "role" in m for m in doc):
        return flatten({m["role"]: {k: v for k, v in m.items() if k != "role"} for m in doc}, prefix)
    return {prefix: doc}


def diff(a: dict[str, Any], b: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(key, in a, in b) for every leaf that differs (None: absent), volatile keys left out."""
    fa, fb = flatten(a), flatten(b)
    keys = sorted(k for k in fa.keys() | fb.keys() if k.split(".")[0] not in VOLATILE)
    return [(k, fa.get(k), fb.get(k)) for k in keys if fa.get(k) != fb.get(k)]


def pick(records: list[tuple[Path, dict[str, Any]]], ref: str) -> tuple[Path, dict[str, Any]]:
    """A record by list number (1-based, negative from the end), file name (".json" optional) or path."""
    try:
        n = int(ref)
    except ValueError:
        n = None
    if n is not None and n != 0 and -len(records) <= n <= len(records):
        return records[n - 1 if n > 0 else n]
    for path, doc in records:
        if ref in (path.name, path.stem, str(path)) or Path(ref).resolve() == path.resolve():
            return path, doc
    path = Path(ref)
    if path.is_file():
        return path, json.loads(path.read_text(encoding="utf-8"))
    raise InvalidRequest(f"no deployment record {ref!r} ({len(records)} recorded; see `edge history`)",
                         "diff")


def _summary(n: int, path: Path, doc: dict[str, Any]) -> str:
    v, models = doc.get("versions", {}), doc.get("models", [])
    served = next((m for m in models if m.get("role") == "served"), {})
    s = doc.get("settings", {})
    listen = f"{s.get('host', {}).get('value')}:{s.get('port', {}).get('value')}"
    model = f"{Path(served.get('path', '?')).name} {served.get('quantization', '')}".strip()
    return (f"{n:>3}  {doc.get('started_at', '?')[:19]}Z  edge {v.get('edge_version')}  "
            f"llama.cpp {v.get('llama_cpp_commit')}  {model}  {listen}  {path.name}")


def render_diff(a: tuple[Path, dict[str, Any]], b: tuple[Path, dict[str, Any]],
                changes: list[tuple[str, Any, Any]]) -> str:
    lines = [f"{a[0].name} -> {b[0].name}: {len(changes)} change{'s' if len(changes) != 1 else ''}"]
    lines += [f"  {k}: {'(absent)' if x is None else x} -> {'(absent)' if y is None else y}"
              for k, x, y in changes]
    return "\n".join(lines)


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    records = load_records(deployments_dir(settings_from_args(args)))
    if args.diff is None:
        if args.json:
            listed = [{"n": i, "file": str(p), **d} for i, (p, d) in enumerate(records, 1)]
            print(json.dumps(listed, indent=2), file=out)
        else:
            print("\n".join(_summary(i, p, d) for i, (p, d) in enumerate(records, 1))
                  or "no deployment records yet (`edge serve` writes one per start)", file=out)
        return 0
    refs = args.diff or ["-2", "-1"]
    if len(refs) != 2 or (not args.diff and len(records) < 2):
        raise InvalidRequest(f"--diff compares two records ({len(records)} recorded)", "diff")
    a, b = pick(records, refs[0]), pick(records, refs[1])
    changes = diff(a[1], b[1])
    if args.json:
        doc = {"a": str(a[0]), "b": str(b[0]), "changes": [{"key": k, "a": x, "b": y} for k, x, y in changes]}
        print(json.dumps(doc, indent=2), file=out)
    else:
        print(render_diff(a, b, changes), file=out)
    return 0
