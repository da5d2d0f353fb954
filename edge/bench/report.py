"""`edge report`'s folder: report.md, the PNG plots, bench.json (raw) and facts.json.

The folder is meant to be kept: next month's run can be compared against it
figure by figure (bench.json has a schema version; facts.json holds the
hardware, model and memory plan the figures were measured with).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from edge.bench import plots
from edge.bench.recommend import recommendation_line
from edge.bench.table import render as render_table

GiB = float(1 << 30)


def _size(n: int | None) -> str:
    if n is None:
        return "unknown"
    return f"{n / GiB:.2f} GiB" if n >= GiB else f"{n / (1 << 20):.1f} MiB"


def _kv(rows: list[tuple[str, Any]]) -> list[str]:
    return ["| | |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)]


def _hardware(hw: dict[str, Any] | None) -> list[str]:
    if hw is None:
        return ["Not collected."]
    keys = ("platform", "profile", "backends", "cpu", "memory", "thermal")
    pf, pr, be, cpu, mem, th = (hw[k] for k in keys)
    have = [k[4:] for k in ("has_cpu", "has_cuda", "has_metal", "has_blas") if be.get(k)]
    zones = ", ".join(f"{z['type']} {z['temp_c']} °C" for z in th["zones"] if z.get("counts"))
    zones = zones or "none exposed"
    tel = hw["telemetry"]
    rows = [
        ("platform", f"{pf['kind']} ({pf['system']} {pf['machine']}) {pf.get('model') or ''}".strip()),
        ("device profile", f"{pr['name']} ({pr['source']}), thermal limit {pr.get('thermal_limit_c')} °C"),
        ("CPUs", f"{cpu['logical']} logical, {cpu['usable']} usable, {cpu['effective']} effective threads"),
        ("memory", f"total {_size(mem['total_bytes'])}, available {_size(mem['available_bytes'])}"),
        ("llama.cpp", f"llama-cpp-python {be.get('llama_cpp_version')}: {', '.join(have) or 'unknown'}"),
        ("thermal zones", zones),
        ("telemetry", f"{tel.get('source')} ({tel.get('reason') or tel.get('error')})"),
    ]
    return _kv(rows)


def _model(info: dict[str, Any] | None, note: str) -> list[str]:
    if info is None:
        return [note or "Model file unknown (the bench ran against a URL); only the served id is known."]
    rows = [
        ("file", f"`{info['path']}` ({_size(info['file_size_bytes'])})"),
        ("name / architecture", f"{info.get('name') or '-'} / {info['architecture']}"),
        ("parameters", f"{info['n_params'] / 1e6:.1f} M"),
        ("file type", info.get("file_type") or "-"),
        ("layers / heads / kv heads", f"{info['n_layer']} / {info['n_head']} / {info['n_head_kv']}"),
        ("trained context", info["n_ctx_train"]),
        ("chat template", "yes" if info.get("chat_template") else "no"),
        ("licence", info.get("license") or "-"),
    ]
    return _kv(rows)


def _settings(doc: dict[str, Any]) -> list[str]:
    s = doc["settings"]
    rows = [
        ("targets", ", ".join(f"{t['label']} ({t['kind']}, {t['url']}, model `{t['model_id']}`)"
                              for t in doc["targets"])),
        ("concurrency ladder", ", ".join(map(str, s["concurrency"]))),
        ("requests per step", f"{s['requests'] or 'as many as fit'} measured after "
                              f"{'C' if s['warmup'] is None else s['warmup']} warmup"
                              + (f", for at most {s['duration_s']} s" if s["duration_s"] else "")),
        ("prompt lengths (≈ tokens)", f"`{s['prompt_lengths']}`"),
        ("max_tokens", f"`{s['max_tokens']}` (temperature 0)"),
        ("endpoint", s["endpoint"]),
        ("request timeout", f"{s['timeout_s']} s"),
        ("seed", s["seed"]),
        *([("started servers", f"threads {s['threads']}, slots {_slots(s)}, ctx {s['ctx']}")]
          if any(t["launched"] for t in doc["targets"]) else []),
        ("machine load", f"1-minute load average {doc.get('loadavg_1m')} at the end of the run"),
    ]
    return _kv(rows)


def _slots(s: dict[str, Any]) -> str:
    sweep = s.get("slots_sweep")
    return f"{', '.join(map(str, sweep))} (one server per setting, in turn)" if sweep else str(s["slots"])


def _sweep(doc: dict[str, Any], images: dict[str, str]) -> list[str]:
    sw = doc.get("sweep")
    if not sw:
        return []
    lines = ["## Slots sweep", "", f"**{recommendation_line(sw['recommendation'])}**", "",
             f"edge was started once per `--slots` setting ({', '.join(map(str, sw['slots']))}) and the "
             f"whole ladder run on each; target P90 TTFT {sw['target_p90_ttft_ms']:g} ms. "
             f"Rule: {sw['rule']}.", ""]
    if "sweep" in images:
        lines += [f"![Slots sweep: tokens/s and P90 TTFT per setting]({images['sweep']})", ""]
    return lines


def render(doc: dict[str, Any], facts: dict[str, Any], images: dict[str, str], date: str) -> str:
    """report.md as text; `images` maps plot names to file names in the folder."""
    plan = facts.get("plan")
    lines = [
        f"# edge report {date}",
        "",
        f"edge {facts.get('edge_version') or doc['edge_version']} · bench run {doc['created_utc']} "
        f"(edge {doc['edge_version']}, schema {doc['schema']} v{doc['schema_version']}) · "
        f"model {', '.join(sorted({t['model_id'] for t in doc['targets']}))}",
        "",
        "Keep this folder: `bench.json` holds every figure and request of the run, `facts.json` the "
        "hardware, model and memory plan. To compare with a later run, render both and read the "
        "tables side by side, or load the two `bench.json` files (same `schema_version`).",
        "",
        "## Hardware (edge doctor, on the machine that wrote this report)",
        "",
        *_hardware(facts.get("hardware")),
        "",
        "## Model (edge inspect)",
        "",
        *_model(facts.get("model"), facts.get("model_note", "")),
        "",
        "## Memory plan (edge plan)",
        "",
        *([f"For the run's ctx {doc['settings']['ctx']} and slots {doc['settings']['slots']}:", "",
           "```", plan["explain"], "```"] if plan and plan.get("explain") else
          [facts.get("plan_note") or "Not computed (no model file)."]),
        "",
        "## Settings",
        "",
        *_settings(doc),
        "",
        "## Results",
        "",
        "Latencies in milliseconds over successful requests (P50/P90/P99, numpy linear interpolation); "
        "TPOT = (e2e - TTFT) / (output tokens - 1); throughput over each step's measured window. "
        f"Knee rule: {doc['knee_rule']}.",
        "",
        render_table(doc, markdown=True),
        "",
    ]
    for name, title in (("throughput", "Throughput vs concurrency"), ("latency", "Latency vs concurrency")):
        if name in images:
            lines += [f"![{title}]({images[name]})", ""]
    lines += _sweep(doc, images)
    lines += ["## Thermal timeline", ""]
    if "thermal" in images:
        n = sum(len(p) for p in doc["timeline"].values())
        lines += [f"{n} samples of /v1/status (1 Hz).", "", f"![Temperature and throttle level over time]"
                  f"({images['thermal']})", ""]
    else:
        lines += ["No timeline: no target answered edge's /v1/status.", ""]
    lines += ["## Power", ""]
    if "power" in images:
        lines += ["Power read by edge's telemetry against the budget it holds, and tokens per joule "
                  "between samples.", "", f"![Power and tokens per joule over time]({images['power']})", ""]
    else:
        lines += ["No power timeline: no edge target reported a power reading (no power input on the "
                  "machine, see `edge doctor`).", ""]
    return "\n".join(lines)


def write(out_dir: Path, doc: dict[str, Any], facts: dict[str, Any], date: str) -> Path:
    """Write the folder; returns the path of report.md."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "bench.json").write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    (out_dir / "facts.json").write_text(json.dumps(facts, indent=2, default=str) + "\n", encoding="utf-8")
    images = {name: path.name for name, path in plots.draw_all(doc, out_dir).items()}
    report = out_dir / "report.md"
    report.write_text(render(doc, facts, images, date) + "\n", encoding="utf-8")
    return report
