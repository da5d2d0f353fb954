"""`edge doctor [--json]`: what edge sees on this machine, and what it will use.

Platform, llama.cpp backends, CPUs, memory (with the cgroup limit), thermal
zones with every trip point, the device profile and the telemetry source that
`serve` would pick, with one live sample from it. Anything unreadable is shown
as unknown, never as a crash: a doctor must work best on a broken machine.
The `--json` keys are stable (see `report()`); README lists them.
"""

from __future__ import annotations

import argparse
import json
import platform as _platform
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edge import __version__
from edge.commands._common import add_settings_args, settings_from_args
from edge.commands.doctor_power import power_report, render_power
from edge.config import load_profile
from edge.errors import ConfigError
from edge.probe import SystemFacts, probe_system, to_plain
from edge.service.telemetry import build_source
from edge.telemetry.detect import resolve
from edge.telemetry.sample import Sample

GiB = float(1 << 30)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("doctor", help="show platform, backends, memory, thermal zones and telemetry")
    p.add_argument("--json", action="store_true", help="print one JSON object with stable keys")
    p.add_argument("--root", type=Path, default=None, help="filesystem root to inspect (tests, containers)")
    p.add_argument("--sysfs-root", type=Path, default=None, help="sysfs root (default: ROOT/sys)")
    p.add_argument("--procfs-root", type=Path, default=None, help="procfs root (default: ROOT/proc)")
    p.add_argument("--profile", default=None, help="device profile to assume instead of detecting")
    p.add_argument("--telemetry", default=None, help="telemetry source: auto|linux|jetson|macos|none|sim:P")
    add_settings_args(p)
    p.set_defaults(func=run)


def _probe_backends() -> Any:
    from edge.runtime.llama.backend import probe_backends

    return probe_backends()


def _build_info() -> Any:
    """Which llama.cpp build runs (`edge.runtime.build_info`; loaded lazily, as the backends are)."""
    import edge.runtime

    return edge.runtime.build_info()


def report(
    root: Path = Path("/"),
    sysfs_root: Path | None = None,
    procfs_root: Path | None = None,
    profile: str | None = None,
    telemetry: str = "auto",
    system: Callable[[], str] = _platform.system,
    machine: Callable[[], str] = _platform.machine,
    backends: Callable[[], Any] | None = _probe_backends,
    runner: Any = None,
    build: Callable[[], Any] | None = None,
    **probe_kw: Any,
) -> dict[str, Any]:
    """Everything doctor shows, as a JSON-ready dict with stable keys (`backends` None: not probed,
    and then neither is the llama.cpp `build`)."""
    sys_root, proc_root = sysfs_root or root / "sys", procfs_root or root / "proc"
    kw: dict[str, Any] = dict(probe_kw, backends=backends)
    facts = probe_system(root, sys_root, proc_root, profile, system, machine, **kw)
    errors = list(facts.errors)
    return {
        "edge_version": __version__,
        "platform": to_plain(facts.platform),
        "profile": _profile(facts, errors),
        "backends": _backends(facts),
        "build": None if backends is None else (build or _build_info)().to_dict(),  # llama.cpp's
        "cpu": to_plain(facts.cpu),
        "memory": _memory(facts),
        "thermal": _thermal(facts),
        "telemetry": _telemetry(telemetry, root, sys_root, proc_root, system, machine),
        "power": _power(root, sys_root, runner),
        "errors": errors,
    }


def _power(root: Path, sys_root: Path, runner: Any) -> dict[str, Any]:
    try:
        return power_report(root, sys_root) if runner is None else power_report(root, sys_root, runner)
    except Exception as exc:  # a doctor reports, it does not die
        return {"error": f"{type(exc).__name__}: {exc}"}


def _profile(facts: SystemFacts, errors: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"name": facts.profile, "source": facts.profile_source}
    try:
        p = load_profile(facts.profile)
        out.update(
            thermal_limit_c=p.thermal_limit_c,
            thermal_critical_c=p.thermal_critical_c,
            unified_memory=p.unified_memory,
            memory_reserve_bytes=p.memory_reserve_bytes,
        )
    except ConfigError as exc:
        errors.append(str(exc))
        out["error"] = str(exc)
    return out


def _backends(facts: SystemFacts) -> dict[str, Any]:
    keys = ("llama_cpp_version", "has_cpu", "has_cuda", "has_metal", "has_blas", "gpu_offload",
            "cpu_extra_buffers", "system_info")
    out: dict[str, Any] = {k: to_plain(getattr(facts.backends, k, None)) for k in keys}
    out["error"] = facts.backends_error
    return out


def _memory(facts: SystemFacts) -> dict[str, Any]:
    m = facts.memory
    cg = m.cgroup
    return {
        "total_bytes": m.total_bytes,
        "available_bytes": m.available_bytes,
        "meminfo_available_bytes": m.meminfo_available_bytes,
        "nvmap_used_bytes": m.nvmap_used_bytes,
        "cgroup": None
        if cg is None
        else {
            "version": cg.version,
            "path": str(cg.path),
            "limit_bytes": cg.limit_bytes,
            "current_bytes": cg.current_bytes,
            "headroom_bytes": cg.headroom_bytes,
        },
    }


def _thermal(facts: SystemFacts) -> dict[str, Any]:
    return {
        "zones": [
            {
                "zone": z.zone,
                "type": z.type,
                "temp_c": z.temp_c,
                "counts": z.counts,
                "passive_trip_c": z.passive_trip_c,
                "critical_trip_c": z.critical_trip_c,
                "trips": [{"type": t.kind, "temp_c": t.temp_c, "hyst_c": t.hyst_c} for t in z.trips],
            }
            for z in facts.zones
        ],
        "hwmon": [to_plain(h) for h in facts.hwmon],
        "cooling": [
            {"name": c.name, "type": c.type, "cur_state": c.cur_state, "max_state": c.max_state}
            for c in facts.cooling
        ],
        "cpufreq": [
            {
                "cpu": f.cpu,
                "cur_khz": f.cur_khz,
                "scaling_max_khz": f.scaling_max_khz,
                "cpuinfo_max_khz": f.cpuinfo_max_khz,
                "capped": f.capped,
            }
            for f in facts.cpufreq
        ],
    }


def _telemetry(
    spec: str,
    root: Path,
    sys_root: Path,
    proc_root: Path,
    system: Callable[[], str],
    machine: Callable[[], str],
) -> dict[str, Any]:
    out: dict[str, Any] = {"spec": spec, "source": None, "reason": None, "sample": None, "error": None}
    try:
        choice = resolve(spec, root, sys_root, proc_root, system, machine)
        out.update(source=choice.kind, reason=choice.reason)
        source = build_source(spec, sys_root, proc_root, root=root, system=system, machine=machine).source
        try:
            out["sample"] = _sample(source.read())
        finally:
            source.close()
    except Exception as exc:  # a doctor reports a broken source, it does not die of it
        out["error"] = f"{type(exc).__name__}: {exc}"
    return out


def _sample(s: Sample) -> dict[str, Any]:
    d = to_plain(s)
    d.pop("zones", None)  # already listed under thermal.zones with their trips
    d.pop("t_s", None)
    for key in ("thermal_pressure", "memory_pressure"):
        level = getattr(s, key)
        d[key] = None if level is None else level.name.lower()
    return d


# --- text output --------------------------------------------------------------------


def _gib(n: int | None) -> str:
    if n is None:
        return "unknown"
    return f"{n / GiB:.1f} GiB" if n >= GiB else f"{n / (1 << 20):.0f} MiB"


def _state(n: int | None) -> str:
    return "unknown" if n is None else str(n)


def _c(t: float | None) -> str:
    return "unknown" if t is None else f"{t:.1f} C"


def render(r: dict[str, Any]) -> str:
    """The report as text, one section after another as `doctor --json` nests them."""
    lines = [f"edge {r['edge_version']} doctor"]
    lines += _render_host(r)
    lines += _render_thermal(r["thermal"])
    lines += _render_telemetry(r)
    if "inputs_present" in r.get("power", {}):
        lines.extend(render_power(r["power"]))
    elif r.get("power"):
        lines.append(f"power      unknown ({r['power'].get('error')})")
    if r["errors"]:
        lines.append("problems")
        lines.extend(f"  ! {e}" for e in r["errors"])
    return "\n".join(lines)


def _render_host(r: dict[str, Any]) -> list[str]:
    """Platform, profile, backends, CPUs and memory."""
    pf, pr, be, cpu, mem = r["platform"], r["profile"], r["backends"], r["cpu"], r["memory"]
    what = ", ".join(x for x in (pf["model"], pf["l4t_release"]) if x)
    limits = f"limit {_c(pr.get('thermal_limit_c'))}, critical {_c(pr.get('thermal_critical_c'))}"
    lines = [
        f"platform   {pf['kind']} ({pf['system']} {pf['machine']}){': ' + what if what else ''}",
        f"profile    {pr['name']} ({pr['source']}); {pr.get('error') or limits}",
    ]
    if be.get("llama_cpp_version") is None:
        lines.append(f"backends   unknown ({be.get('error') or 'llama-cpp-python not found'})")
    else:
        have = [k[4:] for k in ("has_cpu", "has_cuda", "has_metal", "has_blas") if be.get(k)]
        lines.append(
            f"backends   llama-cpp-python {be['llama_cpp_version']}: {', '.join(have)}; "
            f"gpu offload {'yes' if be.get('gpu_offload') else 'no'}"
        )
    if (b := r.get("build")) and not b.get("error"):
        lines.append(f"llama.cpp  build {b['llama_cpp_build']}, commit {b['llama_cpp_commit']}, "
                     f"ggml {b['ggml_version']}; compiled in: {', '.join(b['backends'])}")
    quota = "none" if cpu["quota_cpus"] is None else f"{cpu['quota_cpus']:.2f} CPUs"
    lines.append(
        f"cpus       {cpu['logical'] or 'unknown'} logical, {cpu['usable'] or 'unknown'} usable, "
        f"cgroup quota {quota} -> {cpu['effective']} threads"
    )
    lines.append(
        f"memory     total {_gib(mem['total_bytes'])}, available {_gib(mem['available_bytes'])} "
        f"(MemAvailable {_gib(mem['meminfo_available_bytes'])})"
    )
    cg = mem["cgroup"]
    if cg is None:
        lines.append("cgroup     none found")
    else:
        limit = "no limit" if cg["limit_bytes"] is None else f"limit {_gib(cg['limit_bytes'])}"
        using = _gib(cg["current_bytes"])
        lines.append(f"cgroup     v{cg['version']} {cg['path']}: {limit}, using {using}")
    if mem["nvmap_used_bytes"] is not None:
        lines.append(f"nvmap      {_gib(mem['nvmap_used_bytes'])} of GPU buffers in shared memory")
    return lines


def _render_thermal(th: dict[str, Any]) -> list[str]:
    """Thermal zones with their trips, hwmon sensors, cooling devices and cpufreq caps."""
    none = "" if th["zones"] else " (no thermal sensors exposed)"
    lines = [f"thermal    {len(th['zones'])} zones{none}"]
    for z in th["zones"]:
        trips = ", ".join(f"{t['type']} {_c(t['temp_c'])}" for t in z["trips"]) or "no trips"
        note = "" if z["counts"] else "  [ignored]"
        lines.append(f"  {z['type'][:20]:20} {z['zone']:15} {_c(z['temp_c']):>10}  trips: {trips}{note}")
    for h in th["hwmon"]:
        limits = f"max {_c(h['max_c'])}, crit {_c(h['crit_c'])}"
        lines.append(f"  hwmon {h['chip']}/{h['label']}: {_c(h['temp_c'])} ({limits})")
    if th["cooling"]:
        lines.append(
            "cooling    "
            + ", ".join(
                f"{c['type']} {_state(c['cur_state'])}/{_state(c['max_state'])}" for c in th["cooling"]
            )
        )
    capped = [f["cpu"] for f in th["cpufreq"] if f["capped"]]
    if th["cpufreq"]:
        lines.append(f"cpufreq    {len(th['cpufreq'])} CPUs; capped below max: {capped or 'none'}")
    return lines


def _render_telemetry(r: dict[str, Any]) -> list[str]:
    """The telemetry source chosen, and one sample from it (its errors not already problems)."""
    t = r["telemetry"]
    lines = [f"telemetry  {t['source'] or 'unknown'} (from '{t['spec']}': {t['reason'] or t['error']})"]
    if t["error"]:
        lines.append(f"  ! telemetry source failed: {t['error']}")
    s = t["sample"]
    if s is None:
        return lines
    throttling = s["kernel_throttling"]
    power = "unknown" if s["power_w"] is None else f"{s['power_w']:.1f} W"
    psi = "unknown" if s["psi_some_avg10"] is None else f"{s['psi_some_avg10']:.1f}%"
    lines.append(
        f"  sample   temp {_c(s['temp_c'])}, limit {_c(s['limit_c'])}, "
        f"kernel throttling {'unknown' if throttling is None else throttling}, power {power}, "
        f"mem available {_gib(s['mem_available_bytes'])}, PSI some {psi}"
    )
    seen = set(r["errors"])
    lines.extend(f"  ! {e}" for e in s["errors"] if e not in seen)  # the rest is under problems
    return lines


def run(args: argparse.Namespace) -> int:
    root: Path = args.root or Path("/")
    overrides: dict[str, Any] = {"profile": args.profile, "telemetry": args.telemetry}
    problems: list[str] = []
    try:
        settings = settings_from_args(args, **overrides)
        profile, telemetry = settings.profile, settings.telemetry
        sys_default, proc_default = settings.sysfs_root, settings.procfs_root
    except ConfigError as exc:  # still diagnose the machine with defaults
        problems.append(f"settings: {exc}")
        profile, telemetry = args.profile, args.telemetry or "auto"
        sys_default, proc_default = Path("/sys"), Path("/proc")
    if args.root is not None:
        sys_default, proc_default = root / "sys", root / "proc"
    r = report(
        root,
        args.sysfs_root or sys_default,
        args.procfs_root or proc_default,
        profile,
        telemetry,
    )
    r["errors"] = problems + r["errors"]
    print(json.dumps(r, indent=2) if args.json else render(r))
    return 0
