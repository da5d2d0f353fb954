"""`edge service install`: write a hardened systemd unit for `edge serve`."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

from edge.commands._common import add_settings_args, settings_from_args

DEFAULT_UNIT_PATH = Path("/etc/systemd/system/edge.service")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("service", help="systemd integration")
    ssub = p.add_subparsers(dest="service_command", metavar="ACTION", required=True)
    i = ssub.add_parser("install", help="write a systemd unit (Type=notify, watchdog, sandboxed)")
    who = i.add_mutually_exclusive_group()
    who.add_argument("--user", default=None, help="run as this existing user")
    who.add_argument("--dynamic-user", action="store_true", help="run as a transient user (default)")
    i.add_argument(
        "--output", type=Path, default=None, help=f"unit file to write (default {DEFAULT_UNIT_PATH})"
    )
    i.add_argument("--print", dest="print_only", action="store_true", help="print the unit, write nothing")
    i.add_argument("--model", default=None, help="model to serve (default: settings.default_model)")
    i.add_argument("--host", default=None, help="bind address")
    i.add_argument("--port", type=int, default=None, help="TCP port")
    i.add_argument("--api-key-file", type=Path, default=None, help="bearer key file (needed off loopback)")
    i.add_argument("--agent-port", type=int, default=None,
                   help="serve the HAProxy agent check on this port (README \"Several boxes\")")
    i.add_argument("--agent-host", default=None,
                   help="agent check bind address (off loopback: needs the key)")
    i.add_argument("--watchdog-s", type=int, default=120, help="WatchdogSec (engine stall limit is half)")
    i.add_argument(
        "--exec", dest="exec_path", type=Path, default=None, help="edge executable (default: venv's)"
    )
    i.add_argument("--verify", action="store_true", help="run systemd-analyze verify on the written unit")
    add_settings_args(i)
    i.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from edge.service.agent import agent_bind
    from edge.service.unit import UnitOptions, default_exec_path, render_unit

    settings = settings_from_args(args, host=args.host, port=args.port, api_key_file=args.api_key_file,
                                  agent_port=args.agent_port, agent_host=args.agent_host)
    # refuse now what `edge serve` would refuse at start (the key file is read by the service)
    agent_at = agent_bind(settings, keyed=bool(settings.api_key) or settings.api_key_file is not None)
    extra: list[str] = []
    if agent_at is not None and args.agent_port is not None:
        extra += ["--agent-port", str(agent_at[1])]
        if args.agent_host is not None:
            extra += ["--agent-host", agent_at[0]]
    exec_path = (args.exec_path or default_exec_path()).absolute()
    opts = UnitOptions(
        exec_path=exec_path,
        models_dir=settings.models_dir.absolute(),
        model=args.model,
        user=args.user,
        host=settings.host,
        port=settings.port,
        config_file=args.config.absolute() if args.config else None,
        api_key_file=settings.api_key_file.absolute() if settings.api_key_file else None,
        watchdog_s=args.watchdog_s,
        drain_timeout_s=settings.drain_timeout_s,
        extra_args=tuple(extra),
    )
    text = render_unit(opts)
    if args.print_only:
        sys.stdout.write(text)
        return 0
    out = args.output or DEFAULT_UNIT_PATH
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(out)
    print(f"wrote {out}")
    if args.verify:
        return verify(out)
    if out == DEFAULT_UNIT_PATH:
        print("next: systemctl daemon-reload && systemctl enable --now edge")
    return 0


def verify(path: Path) -> int:
    """systemd-analyze verify; prints its findings. Returns its exit status (127 if missing)."""
    tool = shutil.which("systemd-analyze")
    if tool is None:
        print("systemd-analyze not found; unit not verified", file=sys.stderr)
        return 127
    res = subprocess.run([tool, "verify", str(path)], capture_output=True, text=True, check=False)
    sys.stderr.write(res.stdout + res.stderr)
    print("systemd-analyze verify: " + ("ok" if res.returncode == 0 else f"failed ({res.returncode})"))
    return res.returncode
