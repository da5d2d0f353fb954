"""PNG plots of a bench document, drawn with matplotlib's Agg canvas (no display, no pyplot state).

- throughput.png: requests/s and output tokens/s vs concurrency, one line per target, knee marked
- latency.png:    TTFT, TPOT and end-to-end latency P50/P90/P99 vs concurrency
- power.png:      power against the budget, and tokens per joule (edge targets with a power reading);
- sweep.png:      a slots sweep: output tokens/s and P90 TTFT vs concurrency, one curve per --slots,
                  the target line, each curve's knee and the recommended point
- thermal.png:    temperature and the scheduler's budget (throttle level) over time, steps shaded;
                  only when the run sampled an edge target's /v1/status
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown")
PCT_STYLES = {"p50": "-", "p90": "--", "p99": ":"}


def _save(fig: Figure, path: Path) -> Path:
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=110)
    return path


def _by_target(doc: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for s in doc["steps"]:
        out.setdefault(s["target"], []).append(s)
    return {k: sorted(v, key=lambda s: s["concurrency"]) for k, v in out.items()}


def _ladder_axis(ax: Axes, ladder: list[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(ladder, [str(c) for c in ladder])
    ax.minorticks_off()
    ax.set_xlabel("concurrent clients (closed loop)")
    ax.grid(True, alpha=0.3)


def throughput(doc: dict[str, Any], path: Path) -> Path:
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    axes = fig.subplots(1, 2)
    ladder = sorted({s["concurrency"] for s in doc["steps"]})
    for (label, steps), color in zip(_by_target(doc).items(), COLORS, strict=False):
        cs = [s["concurrency"] for s in steps]
        knee = doc["knee"].get(label)
        for ax, key in zip(axes, ("requests_per_s", "output_tokens_per_s"), strict=True):
            ax.plot(cs, [s[key] for s in steps], "o-", color=color, label=label)
            if knee is not None:
                ax.axvline(knee, color=color, linestyle=":", alpha=0.8, label=f"knee {label} (C={knee})")
    axes[0].set_ylabel("successful requests / s")
    axes[0].set_title("Requests per second")
    axes[1].set_ylabel("output tokens / s")
    axes[1].set_title("Output tokens per second")
    for ax in axes:
        _ladder_axis(ax, ladder)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    fig.suptitle(f"Throughput vs concurrency ({_subtitle(doc)})")
    return _save(fig, path)


def latency(doc: dict[str, Any], path: Path) -> Path:
    fig = Figure(figsize=(15, 4.6), layout="constrained")
    axes = fig.subplots(1, 3)
    ladder = sorted({s["concurrency"] for s in doc["steps"]})
    panels = (("ttft_s", "Time to first token (TTFT)"), ("tpot_s", "Time per output token after the first"),
              ("e2e_s", "End-to-end request latency"))
    targets = _by_target(doc)
    for steps, color in zip(targets.values(), COLORS, strict=False):
        cs = [s["concurrency"] for s in steps]
        for ax, (key, _) in zip(axes, panels, strict=True):
            for q, style in PCT_STYLES.items():
                if key == "tpot_s" and q == "p99":
                    continue  # the tail of a per-token mean says little; P50/P90 do
                ys = [float("nan") if s[key][q] is None else s[key][q] * 1000 for s in steps]
                ax.plot(cs, ys, style, marker="o", markersize=3, color=color)
    # one legend entry per target (colour) and per percentile (line style), not per combination
    handles = [Line2D([], [], color=c, marker="o", label=label)
               for label, c in zip(targets, COLORS, strict=False)]
    handles += [Line2D([], [], color="black", linestyle=st, label=q.upper()) for q, st in PCT_STYLES.items()]
    for ax, (key, title) in zip(axes, panels, strict=True):
        ax.set_title(title)
        ax.set_ylabel("milliseconds")
        _ladder_axis(ax, ladder)
        ax.set_ylim(bottom=0)
        shown = [h for h in handles if not (key == "tpot_s" and h.get_label() == "P99")]
        ax.legend(handles=shown, fontsize=8)
    fig.suptitle(f"Latency percentiles vs concurrency, successful requests ({_subtitle(doc)})")
    return _save(fig, path)


def sweep(doc: dict[str, Any], path: Path) -> Path:
    """The slots sweep: one curve per setting, the target on the latency panel, the pick starred."""
    sw = doc["sweep"]
    fig = Figure(figsize=(11, 4.4), layout="constrained")
    ax_t, ax_l = fig.subplots(1, 2)
    target, rec = sw["target_p90_ttft_ms"], sw["recommendation"]
    for slots, color in zip(sw["slots"], COLORS * 4, strict=False):
        pts = sorted((p for p in sw["points"] if p["slots"] == slots), key=lambda p: p["concurrency"])
        cs = [p["concurrency"] for p in pts]
        ax_t.plot(cs, [p["output_tokens_per_s"] for p in pts], "o-", color=color, label=f"--slots {slots}")
        ax_l.plot(cs, [float("nan") if p["p90_ttft_ms"] is None else p["p90_ttft_ms"] for p in pts], "o-",
                  color=color, label=f"--slots {slots}")
        knee = sw["knee"].get(str(slots))
        if knee is not None:
            for ax in (ax_t, ax_l):
                ax.axvline(knee, color=color, linestyle=":", alpha=0.8)
    ax_l.axhline(target, color="black", linestyle="--", alpha=0.7, label=f"target {target:g} ms")
    if rec is not None:
        name = f"{rec['flags']}" + ("" if rec["met_target"] else " (misses the target)")
        ax_t.plot([rec["concurrency"]], [rec["output_tokens_per_s"]], "*", color="black", markersize=15,
                  label=name)
        ax_l.plot([rec["concurrency"]], [rec["p90_ttft_ms"]], "*", color="black", markersize=15, label=name)
    ax_t.set_ylabel("output tokens / s")
    ax_t.set_title("Output tokens per second")
    ax_l.set_ylabel("P90 TTFT (ms)")
    ax_l.set_title("P90 time to first token")
    ladder = sorted({p["concurrency"] for p in sw["points"]})
    for ax in (ax_t, ax_l):
        _ladder_axis(ax, ladder)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    fig.suptitle(f"Slots sweep, knees dotted ({_subtitle(doc)})")
    return _save(fig, path)


def has_timeline(doc: dict[str, Any]) -> bool:
    return any(any("error" not in p for p in pts) for pts in doc.get("timeline", {}).values())


def thermal(doc: dict[str, Any], path: Path) -> Path:
    fig = Figure(figsize=(11, 6), layout="constrained")
    ax_t, ax_b = fig.subplots(2, 1, sharex=True)
    any_temp = False
    for (label, pts), color in zip(doc["timeline"].items(), COLORS, strict=False):
        ok = [p for p in pts if "error" not in p]
        ts = [p["t_s"] for p in ok]
        temps = [float("nan") if p["temp_c"] is None else p["temp_c"] for p in ok]
        any_temp = any_temp or any(p["temp_c"] is not None for p in ok)
        ax_t.plot(ts, temps, "-", color=color, label=f"{label} temperature")
        limits = {p.get("limit_c") for p in ok if p.get("limit_c") is not None}
        if any_temp and limits:
            ax_t.axhline(max(limits), color=color, linestyle="--", alpha=0.7,
                         label=f"{label} thermal limit {max(limits):.0f} °C")
        budget = [float("nan") if p.get("budget") is None else p["budget"] for p in ok]
        ax_b.plot(ts, budget, "-", color=color, label=f"{label} scheduler budget")
        duty = [_effective_threads(p) for p in ok]
        ax_b.plot(ts, duty, "--", color=color, alpha=0.6, label=f"{label} threads x duty / max")
    if not any_temp:
        modes = sorted({str(p.get("mode")) for pts in doc["timeline"].values()
                        for p in pts if "error" not in p})
        ax_t.text(0.5, 0.5, f"no temperature reading (thermal mode: {', '.join(modes)})",
                  transform=ax_t.transAxes, ha="center", va="center", color="gray")
        ax_t.set_yticks([])
    sampled = [s for s in doc["steps"] if s["target"] in doc["timeline"]]
    for n, s in enumerate(sampled):
        for ax in (ax_t, ax_b):
            ax.axvspan(s["started_s"], s["ended_s"], color="gray", alpha=0.07 if n % 2 else 0.15)
        name = f"C={s['concurrency']}" if len(doc["timeline"]) == 1 else f"{s['target']} C={s['concurrency']}"
        ax_b.text((s["started_s"] + s["ended_s"]) / 2, 1.02, name, ha="center", va="bottom", fontsize=7,
                  color="dimgray")
    ax_t.set_ylabel("temperature (°C)")
    ax_t.set_title("Device temperature (edge /v1/status, 1 Hz)")
    ax_b.set_ylabel("level (1 = full speed)")
    ax_b.set_ylim(-0.05, 1.12)
    ax_b.set_title("Throttle level: the scheduler's budget and the applied threads x duty")
    other = " (unshaded gaps: other targets' steps)" if len(doc["targets"]) > len(doc["timeline"]) else ""
    ax_b.set_xlabel(f"time since the run started (s); shaded: one concurrency step each{other}")
    for ax in (ax_t, ax_b):
        ax.grid(True, alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8, loc="lower left")
    fig.suptitle(f"Thermal timeline ({_subtitle(doc)})")
    return _save(fig, path)


def has_power(doc: dict[str, Any]) -> bool:
    return any(p.get("power_w") is not None for pts in doc.get("timeline", {}).values() for p in pts)


def tokens_per_joule(pts: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """(t_s, tokens per joule) between consecutive samples, from the cumulative energy and tokens."""
    out = []
    prev = None
    for p in pts:
        e, n = p.get("energy_j"), p.get("energy_tokens")
        if e is None or n is None:
            prev = None
            continue
        if prev is not None and e > prev[0]:
            out.append((p["t_s"], (n - prev[1]) / (e - prev[0])))
        prev = (e, n)
    return out


def power(doc: dict[str, Any], path: Path) -> Path:
    fig = Figure(figsize=(11, 6), layout="constrained")
    ax_p, ax_e = fig.subplots(2, 1, sharex=True)
    for (label, pts), color in zip(doc["timeline"].items(), COLORS, strict=False):
        ok = [p for p in pts if "error" not in p]
        ts = [p["t_s"] for p in ok]
        ax_p.plot(ts, [float("nan") if p.get("power_w") is None else p["power_w"] for p in ok], "-",
                  color=color, label=f"{label} power")
        budgets = [float("nan") if p.get("power_budget_w") is None else p["power_budget_w"] for p in ok]
        if any(b == b for b in budgets):  # not all NaN
            ax_p.plot(ts, budgets, "--", color=color, alpha=0.7, label=f"{label} budget")
        tpj = tokens_per_joule(ok)
        if tpj:
            ax_e.plot([t for t, _ in tpj], [v for _, v in tpj], "-", color=color, label=f"{label} tokens/J")
    ax_p.set_ylabel("power (W)")
    ax_p.set_title("Device power and the budget held (edge /v1/status, 1 Hz)")
    ax_e.set_ylabel("tokens per joule")
    ax_e.set_xlabel("time since the run started (s)")
    for ax in (ax_p, ax_e):
        ax.grid(True, alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8, loc="lower left")
    fig.suptitle(f"Power timeline ({_subtitle(doc)})")
    return _save(fig, path)


def _effective_threads(p: dict[str, Any]) -> float:
    """threads x duty relative to the most threads seen in the point's knobs (a 0-1 level)."""
    k = p.get("knobs") or {}
    n, duty = k.get("n_threads"), k.get("duty")
    if n is None or duty is None:
        return float("nan")
    if k.get("paused"):
        return 0.0
    top = p.get("_max_threads") or n
    return min(1.0, n * duty / top)


def _subtitle(doc: dict[str, Any]) -> str:
    """Model and workload in one short line (servers name models by path, alias or file stem)."""
    s = doc["settings"]
    names = {Path(t["model_id"]).name.removesuffix(".gguf") for t in doc["targets"]}
    model = ", ".join(sorted(names))
    if len(model) > 48:
        model = model[:45] + "..."
    return f"{model}; prompts {s['prompt_lengths']}, max_tokens {s['max_tokens']}"


def draw_all(doc: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    """Every plot the document supports, as {name: path}."""
    out = {"throughput": throughput(doc, out_dir / "throughput.png"),
           "latency": latency(doc, out_dir / "latency.png")}
    if doc.get("sweep"):
        out["sweep"] = sweep(doc, out_dir / "sweep.png")
    if has_timeline(doc):
        out["thermal"] = thermal(_with_max_threads(doc), out_dir / "thermal.png")
    if has_power(doc):
        out["power"] = power(doc, out_dir / "power.png")
    return out


def _with_max_threads(doc: dict[str, Any]) -> dict[str, Any]:
    """Annotate timeline points with the target's largest thread count (the 1.0 of the level)."""
    timeline = {}
    for label, pts in doc["timeline"].items():
        top = max((p.get("knobs", {}).get("n_threads") or 0 for p in pts if "error" not in p), default=0)
        timeline[label] = [{**p, "_max_threads": top or None} for p in pts]
    return {**doc, "timeline": timeline}
