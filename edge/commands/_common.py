"""Helpers shared by CLI commands: settings from flags, byte sizes."""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path
from typing import Any

from edge.config import CONFIGS_DIR, Settings, load_settings
from edge.errors import InvalidRequest

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)


def add_settings_args(parser: argparse.ArgumentParser) -> None:
    """Flags every command that reads settings accepts."""
    parser.add_argument("--config", type=Path, default=None, help="settings TOML file")
    parser.add_argument("--models-dir", type=Path, default=None, help="model store directory")


# flags add_ops_args defines, each named as its settings field
OPS_FLAGS = ("audit_log", "audit_log_max_mib", "audit_log_backups", "state_dir")


def add_ops_args(parser: argparse.ArgumentParser) -> None:
    """What a long-running server keeps for its operators: the audit trail and the state dir."""
    parser.add_argument("--audit-log", type=Path, default=None, metavar="FILE",
                        help="append one JSON line per request (who, what, status, tokens; no text)")
    parser.add_argument("--audit-log-max-mib", type=int, default=None, metavar="MIB",
                        help="rotate the audit log at this size (default 64)")
    parser.add_argument("--audit-log-backups", type=int, default=None, metavar="N",
                        help="rotated audit files kept: FILE.1 .. FILE.N (default 3)")
    parser.add_argument("--state-dir", type=Path, default=None, metavar="DIR",
                        help="where deployment records go (default: the user state dir; env EDGE_STATE_DIR)")


def settings_from_args(args: argparse.Namespace, **extra: Any) -> Settings:
    """Settings from flags, TOML and env, with where each value came from (`Settings.origins`);
    a chat template that does not resolve is a ConfigError here, before any model is pulled or
    loaded (the settings layer itself cannot check it)."""
    from edge.host.loading import template_choice
    from edge.provenance import field_origins, toml_keys

    config = getattr(args, "config", None)
    flags = {"models_dir": getattr(args, "models_dir", None),
             **{name: getattr(args, name, None) for name in OPS_FLAGS}, **extra}
    settings = load_settings(config, **flags)
    # the file Settings.settings_customise_sources reads (load_settings points EDGE_CONFIG at `config`)
    toml = config or Path(os.environ.get("EDGE_CONFIG") or CONFIGS_DIR / "edge.toml")
    settings.set_origins(field_origins(Settings.model_fields, flags, toml_keys(toml), os.environ))
    template_choice(settings)
    return settings


def parse_bytes(text: str) -> int:
    """'2G', '512M', '1.5GiB', '1000000' -> bytes (binary multiples: K=1024)."""
    m = _SIZE_RE.match(text)
    if not m:
        raise InvalidRequest(f"not a size: {text!r} (examples: 2G, 512M, 1073741824)", "memory")
    value, unit = float(m.group(1)), m.group(2).lower()
    return int(value * 1024 ** " kmgt".index(unit or " "))
