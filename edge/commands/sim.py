"""`edge sim`: compare thermal/memory policies on the simulated device, in simulated time.

Deterministic (seeded), so two runs print the same table. `--sweep` also finds,
per scenario, the best constant setting that never throttles (and, under a power
budget, keeps every 10 s average within budget + 5 %) and reports the tokens
`edge` delivers as a fraction of it. Power scenarios (power-7w, unplugged,
supply-sag) and sensor faults (rail-stuck, noisy-lag, fan-stuck) report energy,
tokens per joule and the worst 10 s average power against the budget. chat+embed-hot hosts
two models (a chat model and an embedding model) and adds their columns: embeddings done
and seconds the models' threads exceeded what the policy allows the box. `--list` names
every scenario.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from edge.contracts.engine import Knobs
from edge.contracts.options import DEFAULT_DRAFT_MAX, SPECULATIVE_MODES
from edge.sim.harness import POLICIES, PROFILES, SCENARIOS, run_scenario, sweep
from edge.sim.metrics import RunMetrics
from edge.sim.throughput import DEFAULT_CALIBRATION, ThroughputModel, load_throughput

POWER_KEYS = ("avg_power_w", "energy_j", "tokens_per_j", "worst_window_ratio", "worst_transition_ratio",
              "windows_over_budget", "max_10s_avg_power_w", "supply_over_s", "battery_end_pct")
HOST_KEYS = ("embed_inputs", "embed_requests", "threads_over_allowance_s", "max_threads_in_use",
             "both_busy_s")  # two resident models (multimodel.py)
JSON_KEYS = ("scenario", "policy", "tokens", "max_temp_c", "seconds_above_limit_minus_3",
             "seconds_hw_throttled", "p50_token_latency_s", "p99_token_latency_s",
             "interactive_p99_ttft_s", "oom_events")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("sim", help="simulate policies on a simulated device (deterministic)",
                              description=__doc__)
    p.add_argument("--json", action="store_true", help="print a JSON list, one object per scenario x policy")
    p.add_argument("--list", action="store_true", help="list the scenarios and exit")
    p.add_argument("--duration-s", type=float, default=1800.0, help="simulated seconds per run")
    p.add_argument("--scenario", action="append", choices=sorted(SCENARIOS), help="repeatable; default all")
    p.add_argument("--policy", action="append", choices=POLICIES, help="repeatable; default all")
    p.add_argument("--profile", action="append", help=f"device profile, repeatable (default {PROFILES[0]})")
    p.add_argument("--calibration", default=DEFAULT_CALIBRATION,
                   help="throughput file name in configs/throughput or a path")
    p.add_argument("--sweep", action="store_true", help="find the best never-throttling constant")
    p.add_argument("--seed", type=int, action="append",
                   help="repeatable: run every scenario once per seed (default 7); rows carry `seed`")
    # the modelled engine has no draft model: every mode but "draft"
    p.add_argument("--speculative", choices=[m for m in SPECULATIVE_MODES if m != "draft"], default="off",
                   help=f"the engine speculates (prompt lookup, draft up to {DEFAULT_DRAFT_MAX}) as its step "
                   "plan chooses")
    p.set_defaults(func=run)


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    return f"{v:.2f}" if isinstance(v, float) else str(v)


def run(args: argparse.Namespace) -> int:
    if args.list:
        width = max(map(len, SCENARIOS))
        for sc in SCENARIOS.values():
            print(f"{sc.name.ljust(width)}  {sc.description}")
        return 0
    tp = load_throughput(args.calibration)
    scenarios = args.scenario or list(SCENARIOS)
    policies = args.policy or list(POLICIES)
    profiles = args.profile or [PROFILES[0]]
    seeds = args.seed or [7]
    draft_max = DEFAULT_DRAFT_MAX if args.speculative == "ngram" else 0
    rows: list[dict[str, Any]] = []
    for seed, profile, sc in ((sd, pr, sc) for sd in seeds for pr in profiles for sc in scenarios):
        by_policy: dict[str, dict[str, Any]] = {}
        for pol in policies:
            m = run_scenario(sc, pol, profile, tp, args.duration_s, seed, draft_max=draft_max)
            by_policy[pol] = _row(m, profile, seed)
            rows.append(by_policy[pol])
        if args.sweep:
            info = _sweep_info(sc, profile, tp, args.duration_s, seed, by_policy.get("edge"))
            for row in by_policy.values():
                row.update(info)
    if args.json:
        json.dump(rows, sys.stdout, indent=1)
        print()
        return 0
    _print_table(rows, multi_seed=len(seeds) > 1)
    for r in rows:
        if r["policy"] == "edge":
            for line in _edge_notes(r):
                print(line)
    return 0


def _row(m: RunMetrics, profile: str, seed: int) -> dict[str, Any]:
    """One scenario x policy run as a JSON row (power and speculation keys only when measured)."""
    row = {k: m.as_dict()[k] for k in JSON_KEYS}
    row.update({k: m.extra[k] for k in ("spec_drafted", "spec_accepted") if k in m.extra})
    row.update(profile=profile, seed=seed, lost_without_error=m.lost_without_error,
               shed_with_error=m.shed_with_error, rejected_with_error=m.rejected_with_error)
    row.update({k: m.extra[k] for k in (*POWER_KEYS, *HOST_KEYS) if k in m.extra})
    if "unloaded_interactive_p99_ttft_s" in m.extra:
        row["unloaded_interactive_p99_ttft_s"] = m.extra["unloaded_interactive_p99_ttft_s"]
    if "reasoning_budget" in m.extra:
        row["reasoning_budget"] = m.extra["reasoning_budget"]
    return row


def _sweep_info(sc: str, profile: str, tp: ThroughputModel, duration_s: float, seed: int,
                edge_row: dict[str, Any] | None) -> dict[str, Any]:
    """The best constant settings for one scenario and edge's tokens as a fraction of theirs."""
    cache: dict[Knobs, RunMetrics] = {}
    info: dict[str, Any] = {}
    # "best_constant": never throttles; "best_strict_constant": also never within 3 C of
    # the limit, the line edge is held to (the like-for-like comparison)
    for key, strict in (("best_constant", False), ("best_strict_constant", True)):
        knobs, best = sweep(sc, profile, tp, duration_s, seed, strict=strict, cache=cache)
        info[key] = None if knobs is None else {
            "active": knobs.active_limit, "threads": knobs.n_threads, "duty": knobs.duty,
            "off_threads": knobs.off_threads,
            "max_temp_c": None if best is None else round(best.max_temp_c, 2)}
        info[f"{key}_tokens"] = None if best is None else best.tokens
        if edge_row is not None and best is not None and best.tokens:
            frac_key = ("edge_fraction_of_best_strict_constant" if strict
                        else "edge_fraction_of_best_constant")
            info[frac_key] = round(edge_row["tokens"] / best.tokens, 3)
    return info


def _print_table(rows: list[dict[str, Any]], *, multi_seed: bool) -> None:
    """The comparison as aligned columns; a seed column only when several seeds ran."""
    cols = ["profile", "scenario", "policy", "tokens", "max_temp_c", "seconds_above_limit_minus_3",
            "seconds_hw_throttled", "p50_token_latency_s", "p99_token_latency_s", "interactive_p99_ttft_s",
            "oom_events", "lost_without_error"]
    heads = ["profile", "scenario", "policy", "tokens", "maxT", "s>=lim-3", "s_throttled", "p50_tok",
             "p99_tok", "p99_ttft", "oom", "lost"]
    if multi_seed:
        cols, heads = ["seed", *cols], ["seed", *heads]
    if any("embed_inputs" in r for r in rows):  # two resident models: embeddings and threads in use
        cols, heads = [*cols, "embed_inputs", "threads_over_allowance_s"], [*heads, "embed_in", "s_thr>allow"]
    table = [heads] + [[_fmt(r.get(c)) for c in cols] for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(heads))]
    for line in table:
        print("  ".join(cell.rjust(w) for cell, w in zip(line, widths, strict=True)))


def _edge_notes(r: dict[str, Any]) -> list[str]:
    """What edge's row means beside the table: power, unloaded TTFT, the best constants."""
    where = f"{r['profile']} {r['scenario']} (seed {r['seed']})"
    notes: list[str] = []
    if "worst_window_ratio" in r:
        notes.append(f"{where}: power avg {_fmt(r['avg_power_w'])} W, "
                     f"worst 10 s window {_fmt(r['worst_window_ratio'])} x budget (across a budget step "
                     f"{_fmt(r['worst_transition_ratio'])}), {_fmt(r['tokens_per_j'])} tokens/J")
    think = r.get("reasoning_budget")
    if think and think["shrunk_s"] > 0:
        base, end = ("unlimited" if think[k] is None else think[k] for k in ("base_tokens", "tokens"))
        notes.append(f"{where}: thinking budget cut for {think['shrunk_s']:.0f} s, down to "
                     f"{think['min_tokens']} tokens (from {base}); at the end: {end} ({think['reason']})")
    if "unloaded_interactive_p99_ttft_s" in r:
        notes.append(f"{where}: edge interactive p99 TTFT "
                     f"{_fmt(r['interactive_p99_ttft_s'])} s vs unloaded "
                     f"{_fmt(r['unloaded_interactive_p99_ttft_s'])} s")
    if "best_constant_tokens" in r and r["best_constant"] is None:
        notes.append(f"{where}: no constant setting runs without "
                     f"throttling or an OOM kill; edge {r['tokens']} tokens, {r['oom_events']} OOM")
    elif "best_constant_tokens" in r:
        within = " within the power budget" if "worst_window_ratio" in r else ""
        notes.append(f"{where}: best never-throttling "
                     f"constant{within} "
                     f"{r['best_constant']} -> {r['best_constant_tokens']} tokens; edge {r['tokens']} "
                     f"({_fmt(r.get('edge_fraction_of_best_constant'))}); best constant staying 3 C below "
                     f"the limit {r.get('best_strict_constant')} -> {r.get('best_strict_constant_tokens')} "
                     f"({_fmt(r.get('edge_fraction_of_best_strict_constant'))})")
    return notes
