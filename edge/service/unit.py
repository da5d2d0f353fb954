"""systemd unit generation for `edge serve`.

The unit is hardened by default: Type=notify with a watchdog tied to engine
progress, Restart=on-failure, a dynamic or dedicated user, read-only system
and no home access, write access only to the model store.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from edge.errors import ConfigError


@dataclass(frozen=True)
class UnitOptions:
    exec_path: Path  # the venv's `edge` script
    models_dir: Path
    model: str | None = None
    user: str | None = None  # None -> DynamicUser=yes
    host: str = "127.0.0.1"
    port: int = 8088
    config_file: Path | None = None
    api_key_file: Path | None = None
    watchdog_s: int = 120
    drain_timeout_s: float = 30.0
    description: str = "edge: on-device LLM inference server"
    extra_args: tuple[str, ...] = field(default_factory=tuple)


def default_exec_path() -> Path:
    """The `edge` script next to this interpreter (the venv's bin/)."""
    return Path(sys.executable).parent / "edge"


def _quote(arg: str) -> str:
    """systemd ExecStart quoting: shell-like quotes, and % doubled (specifier escape)."""
    return shlex.quote(arg).replace("%", "%%")


HOME_ROOTS = (Path("/home"), Path("/root"), Path("/run/user"))
STATE_ROOT = Path("/var/lib")


def _under(path: Path, roots: tuple[Path, ...]) -> bool:
    return any(path == r or r in path.parents for r in roots)


def _protect_home(opts: UnitOptions) -> str:
    """`yes` hides /home entirely; a venv or store under /home needs `read-only` (+ ReadWritePaths)."""
    return "read-only" if _under(opts.exec_path, HOME_ROOTS) or _under(opts.models_dir, HOME_ROOTS) else "yes"


def _state_directory(opts: UnitOptions) -> list[str]:
    """A store under /var/lib/NAME is created and chowned by systemd (needed with DynamicUser)."""
    if STATE_ROOT in opts.models_dir.parents:
        return [f"StateDirectory={opts.models_dir.relative_to(STATE_ROOT).parts[0]}"]
    return []


def render_unit(opts: UnitOptions) -> str:
    """The unit file's text: [Unit], a notify service with a watchdog, its hardening, [Install]."""
    _check(opts)
    # Time systemd waits for the drain: the drain itself plus room for uvicorn's shutdown.
    stop_timeout_s = int(opts.drain_timeout_s) + 15
    lines = [
        "[Unit]",
        f"Description={opts.description}",
        "After=network-online.target",
        "Wants=network-online.target",
        "",
        "[Service]",
        "Type=notify",
        "NotifyAccess=main",
        f"ExecStart={_exec_start(opts)}",
        f"WatchdogSec={opts.watchdog_s}",
        "Restart=on-failure",
        "RestartSec=5",
        "TimeoutStartSec=600",
        f"TimeoutStopSec={stop_timeout_s}",
        "KillSignal=SIGTERM",
        "KillMode=mixed",
        "Environment=PYTHONUNBUFFERED=1",
        *(["DynamicUser=yes"] if opts.user is None else [f"User={opts.user}", f"Group={opts.user}"]),
        *_hardening(opts),
        "",
        "[Install]",
        "WantedBy=multi-user.target",
        "",
    ]
    return "\n".join(lines)


def _check(opts: UnitOptions) -> None:
    if not opts.exec_path.is_absolute():
        raise ConfigError("exec_path", f"ExecStart needs an absolute path, got {opts.exec_path}")
    if opts.user is not None and (not opts.user or any(c in opts.user for c in " \n=")):
        raise ConfigError("user", f"invalid user name {opts.user!r}")


def _exec_start(opts: UnitOptions) -> str:
    """`edge serve` with the options, quoted for systemd."""
    args = [str(opts.exec_path), "serve"]
    if opts.model:
        args.append(opts.model)
    args += ["--host", opts.host, "--port", str(opts.port), "--models-dir", str(opts.models_dir)]
    if opts.config_file is not None:
        args += ["--config", str(opts.config_file)]
    if opts.api_key_file is not None:
        args += ["--api-key-file", str(opts.api_key_file)]
    args += list(opts.extra_args)
    return " ".join(_quote(a) for a in args)


def _hardening(opts: UnitOptions) -> list[str]:
    """Sandboxing: read-only system, no home (or read-only when needed), write access to the store."""
    return [
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        f"ProtectHome={_protect_home(opts)}",
        "PrivateTmp=yes",
        "PrivateDevices=no",  # GPUs (Jetson nvgpu, /dev/nvidia*) are devices
        "ProtectKernelTunables=yes",
        "ProtectKernelModules=yes",
        "ProtectControlGroups=yes",
        "RestrictSUIDSGID=yes",
        "LockPersonality=yes",
        "RestrictRealtime=yes",
        "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6",
        "SystemCallArchitectures=native",
        "CapabilityBoundingSet=",
        "UMask=0077",
        f"ReadWritePaths={_quote(str(opts.models_dir))}",
        *_state_directory(opts),
    ]


def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """Section -> key -> values, for structural checks (tests and `service install --check`)."""
    out: dict[str, dict[str, list[str]]] = {}
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            out.setdefault(section, {})
            continue
        key, sep, value = line.partition("=")
        if not sep or not section:
            raise ConfigError("unit", f"malformed line: {raw!r}")
        out[section].setdefault(key.strip(), []).append(value.strip())
    return out
