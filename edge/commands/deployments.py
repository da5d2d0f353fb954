"""A record of every `edge serve` start: `deployments/<UTC time>.json` in edge's state directory.

"What exactly was running when it went wrong?" is answered weeks later, after upgrades and
edited unit files, so each start writes down what it ran: edge's version and the llama.cpp
build, each model's sha256 and quantization, every effective setting with where its value came
from (default, profile, file, environment, flag; `edge.provenance`), and the doctor's summary
of the machine. `edge history` lists the records and `--diff` compares two of them.
A record that cannot be written is logged, never fatal: serving matters more than the record.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from edge.config import Settings

log = logging.getLogger("edge.deployments")

SCHEMA, SCHEMA_VERSION = "edge.deployment", 1
VOLATILE = frozenset({"started_at", "pid", "file"})  # differ on every start: never a "change"


def deployments_dir(settings: Settings) -> Path:
    return settings.resolved_state_dir() / "deployments"


def _utc_now() -> datetime:
    return datetime.now(timezone.utc)


def model_facts(role: str, path: Path, previous: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A model file's identity: sha256 (reused from the last record when the file's path, size and
    mtime are unchanged: hashing gigabytes on every start is slow), quantization, architecture."""
    from edge.gguf import validated
    from edge.store_fetch import sha256_file

    path = path.resolve()
    st = path.stat()
    facts: dict[str, Any] = {"role": role, "path": str(path), "size_bytes": st.st_size,
                             "mtime_ns": st.st_mtime_ns}
    info = validated(path)
    facts["quantization"] = (info.file_type or "unknown").removeprefix("MOSTLY_").removeprefix("ALL_")
    facts["architecture"] = info.architecture
    key = ("path", "size_bytes", "mtime_ns")
    same = [m for m in previous or () if all(m.get(k) == facts[k] for k in key)]
    facts["sha256"] = same[0]["sha256"] if same and same[0].get("sha256") else sha256_file(path)
    return facts


def doctor_summary(report: dict[str, Any]) -> dict[str, Any]:
    """The doctor's facts that identify the machine (not its momentary load: free memory, temperatures)."""
    pf, pr, cpu, mem = report["platform"], report["profile"], report["cpu"], report["memory"]
    cg = mem.get("cgroup") or {}
    return {
        "platform": {k: pf.get(k) for k in ("kind", "system", "machine", "model", "l4t_release")},
        "profile": {"name": pr.get("name"), "source": pr.get("source")},
        "gpu_offload": report["backends"].get("gpu_offload"),
        "cpu": {k: cpu.get(k) for k in ("logical", "usable", "quota_cpus", "effective")},
        "memory_total_bytes": mem.get("total_bytes"),
        "cgroup_limit_bytes": cg.get("limit_bytes"),
        "thermal_zones": len(report["thermal"]["zones"]),
        "telemetry": report["telemetry"].get("source"),
        "problems": list(report["errors"]),
    }


def _doctor(settings: Settings) -> dict[str, Any]:
    from edge.commands.doctor import report

    try:
        return doctor_summary(report(sysfs_root=settings.sysfs_root, procfs_root=settings.procfs_root,
                                     profile=settings.profile, telemetry=settings.telemetry))
    except Exception as exc:  # a record describes what it can
        return {"error": f"{type(exc).__name__}: {exc}"}


def _settings(settings: Settings) -> dict[str, dict[str, Any]]:
    from edge.provenance import effective
    from edge.service.launch import device_profile

    try:
        profile = device_profile(settings)
    except Exception:  # an unknown profile name stays as the setting says
        profile = None
    return effective(settings.model_dump(), settings.origins(), profile)


def start_record(settings: Settings, models: list[tuple[str, Path]], *,
                 now: Callable[[], datetime] = _utc_now,
                 doctor: Callable[[Settings], dict[str, Any]] = _doctor,
                 build: Callable[[], dict[str, Any]] | None = None) -> dict[str, Any]:
    """The record of this start (`models`: (role, file) pairs, the served model first)."""
    if build is None:
        from edge.api.build import running as build
    previous = latest_models(deployments_dir(settings))
    return {
        "schema": SCHEMA, "schema_version": SCHEMA_VERSION,
        "started_at": now().isoformat(timespec="microseconds").replace("+00:00", "Z"),
        "pid": os.getpid(),
        "versions": build(),
        "models": [model_facts(role, path, previous) for role, path in models],
        "settings": _settings(settings),
        "doctor": doctor(settings),
    }


def write_record(record: dict[str, Any], directory: Path) -> Path:
    """deployments/<UTC time>.json, created exclusively (a second start in the same second gets
    a suffix; no record is ever overwritten)."""
    directory.mkdir(parents=True, exist_ok=True)
    stamp = record["started_at"][:19].replace(":", "-") + "Z"
    text = json.dumps(record, indent=2, sort_keys=True) + "\n"
    for n in range(1, 1000):
        path = directory / (f"{stamp}.json" if n == 1 else f"{stamp}-{n}.json")
        try:
            with path.open("x", encoding="utf-8") as fh:
                fh.write(text)
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"{directory}: too many records for {stamp}")


def record_start(settings: Settings, model_paths: Sequence[Path]) -> Path | None:
    """`edge serve`'s hook (`model_paths`: the models it serves from the start): log what runs and
    write its record; None (and a warning) when that fails."""
    from edge.store import resolve_model

    others = (("draft", settings.draft_model if settings.speculative == "draft" else None),
              ("embeddings", settings.embedding_model))
    try:
        models = [("served", p) for p in model_paths]
        models += [(role, resolve_model(ref, settings)) for role, ref in others if ref]
        record = start_record(settings, models)
        v = record["versions"]
        log.info("edge %s on llama-cpp-python %s, llama.cpp build %s (commit %s), backends %s",
                 v["edge_version"], v["llama_cpp_python"], v["llama_cpp_build"], v["llama_cpp_commit"],
                 ", ".join(v["backends"]) or "none")
        path = write_record(record, deployments_dir(settings))
    except Exception as exc:
        log.warning("deployment record not written: %s: %s", type(exc).__name__, exc)
        return None
    log.info("deployment record %s", path)
    return path


def load_records(directory: Path, newest: int | None = None) -> list[tuple[Path, dict[str, Any]]]:
    """Every readable record (or those of the `newest` file names), oldest first (by start time,
    then name); unreadable files skipped. Names are UTC start times, so `newest` reads a few files
    where a box restarted for months has thousands."""
    paths = sorted(directory.glob("*.json")) if directory.is_dir() else []
    out = []
    for path in paths[-newest:] if newest else paths:
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            log.warning("skipping unreadable deployment record %s", path)
            continue
        if isinstance(doc, dict) and doc.get("schema") == SCHEMA:
            out.append((path, doc))
    return sorted(out, key=lambda pd: (str(pd[1].get("started_at", "")), pd[0].name))


def latest_models(directory: Path) -> list[dict[str, Any]]:
    records = load_records(directory, newest=3)  # a second start in one second sorts by content
    return list(records[-1][1].get("models", [])) if records else []
