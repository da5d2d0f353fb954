"""`edge status [--url URL] [--json]`: what a running server reports."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from edge.commands._common import add_settings_args, settings_from_args


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("status", help="show a running server's model, slots, queue and scheduler")
    p.add_argument("--url", default=None, help="server URL (default: http://HOST:PORT from settings)")
    p.add_argument("--json", action="store_true", help="print the raw /v1/status JSON")
    add_settings_args(p)
    p.set_defaults(func=run)


def default_url(args: argparse.Namespace) -> tuple[str, str | None]:
    settings = settings_from_args(args)
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::") else settings.host
    url = args.url or os.environ.get("EDGE_URL") or f"http://{host}:{settings.port}"
    return url, settings.resolved_api_key()


def power_line(p: dict[str, Any]) -> str:
    """`power     7.02 W of 7 W budget (setting, limiting); on battery 41%; 0.41 J/token`."""
    watts = "unknown" if p.get("power_w") is None else f"{p['power_w']:.2f} W"
    if p.get("power_stale"):
        watts += " (stale)"
    budget = ("no budget" if p.get("budget_w") is None
              else f"of {p['budget_w']:g} W budget ({p.get('budget_origin')}, {p.get('control')})")
    parts = [f"power     {watts} {budget}"]
    if p.get("on_battery") is not None:
        pct = "" if p.get("battery_pct") is None else f" {p['battery_pct']:.0f}%"
        parts.append(("on battery" if p["on_battery"] else "on mains") + pct
                     + (", under the reserve: background waits" if p.get("battery_low") else ""))
    if p.get("joules_per_token") is not None:
        parts.append(f"{p['joules_per_token']:.3f} J/token")
    return "; ".join(parts)


def summarize(s: dict[str, Any]) -> str:
    eng, slots, srv = s.get("engine") or {}, s.get("slots") or {}, s.get("server") or {}
    lines = [
        f"model     {s['model']['id']} (n_ctx {s['model']['n_ctx']})",
        f"server    {srv.get('state')} ready={srv.get('ready')} ({srv.get('reason')}), "
        f"uptime {srv.get('uptime_s', 0):.0f} s, in flight {srv.get('in_flight')}",
        f"engine    {eng.get('state')}, step {1000 * (eng.get('step_time_s') or 0):.1f} ms, "
        f"{eng.get('total_tokens_decoded', 0)} tokens generated",
        f"slots     {slots.get('active')}/{slots.get('total')} active, {slots.get('waiting')} waiting, "
        f"{slots.get('parked')} parked",
    ]
    if eng.get("kv_cells_total"):
        lines.append(f"kv        {eng['kv_cells_used']}/{eng['kv_cells_total']} cells")
    knobs = s.get("knobs")
    if knobs:
        lines.append("knobs     " + ", ".join(f"{k}={v}" for k, v in knobs.items()))
    sched = s.get("scheduler")
    if sched:
        decision = sched.get("decision") or {}
        lines.append(
            f"scheduler {decision.get('mode', '?')}: {decision.get('reason', '')} "
            f"(temp {sched.get('temp_c')} °C)"
        )
        cpu = sched.get("cpu_contention") or {}
        if cpu.get("known"):
            taken = f"{cpu.get('other_cores')} of {cpu.get('cores')} cores taken by other processes"
        else:
            taken = "unknown (no CPU accounting readable yet)"
        cap = sched.get("threads_cap")
        lines.append(f"cpu       {taken}; decode threads {'capped at ' + str(cap) if cap else 'not capped'}")
        lines.append(power_line(sched.get("power") or {}))
    bal = s.get("balancer")
    if bal:
        lines.append(balancer_line(bal))
    lines.extend(host_lines(s.get("host")))
    return "\n".join(lines)


def host_lines(host: dict[str, Any] | None) -> list[str]:
    """The model host: the budget, and one line per model it has seen (state, size, requests, use)."""
    if not host:
        return []
    out = [f"memory    {host['resident_bytes'] >> 20} of {host['memory_budget_bytes'] >> 20} MiB budget "
           "held by resident models"]
    for m in host.get("models") or []:
        ago = m.get("last_used_s_ago")
        used = f"used {ago:.0f} s ago" if ago is not None else "never used"
        extra = f", {m['waiting_for_load']} waiting for its load" if m.get("waiting_for_load") else ""
        err = f", last load failed: {m['error']}" if m.get("error") else ""
        out.append(f"  {m['model']:<28} {m['state']:<9} {m['planned_bytes'] >> 20:>5} MiB, "
                   f"{m['requests']} requests{extra}, {used}{' (pinned)' if m.get('pinned') else ''}{err}")
    return out


def balancer_line(bal: dict[str, Any]) -> str:
    """What the HAProxy agent check answers now and why ('agent off' when --agent-port is unset)."""
    agent = bal.get("agent")
    where = f"agent {agent['host']}:{agent['port']}" if agent else "agent off"
    factors = ", ".join(f"{k} {v:.2f}" for k, v in (bal.get("factors") or {}).items())
    return (f"balancer  {bal.get('line')} ({bal.get('reason')}); {where}"
            + (f"; headroom {factors}" if factors else ""))


def run(args: argparse.Namespace) -> int:
    from edge.service.client import ApiClient

    url, key = default_url(args)
    status = ApiClient(url, key, timeout_s=10.0).get_json("/v1/status")
    print(json.dumps(status, indent=2) if args.json else summarize(status))
    return 0
