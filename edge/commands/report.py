"""`edge report [MODEL | --url URL] [--bench FILE.json] [--out DIR]`: a folder to keep.

Writes DIR/report.md (default ./edge-report-<date>; DIR-2, DIR-3 ... when DIR is taken: a report
never writes over an older one) with the hardware (`edge doctor`),
the model (`edge inspect`), the memory plan (`edge plan`), the settings and the bench
results with PNG plots, plus the raw bench.json and facts.json beside it. The results
come from --bench FILE (a document of `edge bench http --json`), or the report runs
the ladder itself with the same flags as `edge bench http`. Exit status as
`edge bench http` (0; 1 some requests of the run failed; 2 usage/config; 3 a server
did not start); a report from --bench FILE exits 0 once written.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import itertools
import json
import sys
from pathlib import Path
from typing import Any

from edge import __version__
from edge.commands.bench import add_load_args, reported, run_ladder


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="write a kept report: hardware, model, memory plan, bench plots")
    add_load_args(p)
    p.add_argument("--bench", type=Path, default=None, metavar="FILE.json",
                   help="results of `edge bench http --json FILE` instead of running the ladder")
    p.add_argument("--out", type=Path, default=None,
                   help="output folder (default ./edge-report-<date>; OUT-2, OUT-3 ... if it exists)")
    p.set_defaults(func=run)


def fresh_dir(base: Path) -> Path:
    """`base`, else base-2, base-3 ...: the first that is new (or an empty folder), created here,
    so a second report the same day (or into the same --out) never overwrites the first."""
    for n in itertools.count(1):
        path = base if n == 1 else base.with_name(f"{base.name}-{n}")
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:
            if path.is_dir() and not any(path.iterdir()):
                return path
    raise AssertionError("unreachable")


def load_bench(path: Path) -> dict[str, Any]:
    from edge.bench.runner import SCHEMA, SCHEMA_VERSION
    from edge.errors import ConfigError

    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError("bench", f"cannot read {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError("bench", f"{path} is not JSON: {exc.msg}") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise ConfigError("bench", f"{path} is not an `edge bench http --json` document")
    if doc.get("schema_version") != SCHEMA_VERSION:
        raise ConfigError("bench", f"{path} has schema version {doc.get('schema_version')}, "
                                   f"this edge reads {SCHEMA_VERSION}")
    return doc


def _model_path(args: argparse.Namespace, doc: dict[str, Any]) -> Path | None:
    from edge.commands.inspect import resolve_model_path

    if args.model is not None:
        return Path(resolve_model_path(args.model, args))
    recorded = doc["settings"].get("model_path")
    return Path(recorded) if recorded and Path(recorded).is_file() else None


def collect_facts(args: argparse.Namespace, doc: dict[str, Any], model: Path | None) -> dict[str, Any]:
    """Hardware, model and memory plan, each computed in-process; a failure is noted, not fatal."""
    from edge.commands.doctor import report as doctor_report
    from edge.gguf import info_to_json, validate_gguf

    facts: dict[str, Any] = {"edge_version": __version__}
    try:
        facts["hardware"] = doctor_report()
    except Exception as exc:  # a report describes what it can
        facts["hardware"], facts["hardware_note"] = None, f"doctor failed: {exc}"
    if model is None:
        facts["model"], facts["plan"] = None, None
        facts["model_note"] = "Model file unknown (the bench measured a URL); pass MODEL to describe it."
        return facts
    facts["model"] = info_to_json(validate_gguf(model))
    try:
        from edge.commands._common import settings_from_args
        from edge.host.loading import plan_for

        s = doc["settings"]
        settings = settings_from_args(args, n_ctx=s["ctx"], slots=s["slots"], threads=s["threads"])
        _, plan = plan_for(model, settings)
        facts["plan"] = {**plan.to_json(), "explain": plan.explain()}
    except Exception as exc:
        facts["plan"], facts["plan_note"] = None, f"plan failed: {type(exc).__name__}: {exc}"
    return facts


def run(args: argparse.Namespace) -> int:
    from edge.bench.report import write
    from edge.commands.exits import EXIT_FAILED as EXIT_REQUESTS_FAILED
    from edge.commands.exits import EXIT_OK
    from edge.errors import EdgeError

    today = _dt.date.today().isoformat()
    try:
        if args.bench is not None:
            doc = load_bench(args.bench)
        else:
            doc = run_ladder(args, progress=sys.stderr.isatty())
        model = _model_path(args, doc)
    except EdgeError as exc:
        return reported(exc)
    out = fresh_dir(args.out or Path(f"edge-report-{today}"))
    path = write(out, doc, collect_facts(args, doc, model), today)
    print(f"report written to {path}")
    if args.bench is None and doc["failed_requests"]:
        return EXIT_REQUESTS_FAILED
    return EXIT_OK
