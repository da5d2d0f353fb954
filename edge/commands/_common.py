"""Helpers shared by CLI commands: settings from flags, byte sizes."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from edge.config import Settings, load_settings
from edge.errors import InvalidRequest

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)


def add_settings_args(parser: argparse.ArgumentParser) -> None:
    """Flags every command that reads settings accepts."""
    parser.add_argument("--config", type=Path, default=None, help="settings TOML file")
    parser.add_argument("--models-dir", type=Path, default=None, help="model store directory")


def settings_from_args(args: argparse.Namespace, **extra: Any) -> Settings:
    """Settings from flags, TOML and env; a chat template that does not resolve is a ConfigError
    here, before any model is pulled or loaded (the settings layer itself cannot check it)."""
    from edge.host.loading import template_choice

    settings = load_settings(
        getattr(args, "config", None), models_dir=getattr(args, "models_dir", None), **extra
    )
    template_choice(settings)
    return settings


def parse_bytes(text: str) -> int:
    """'2G', '512M', '1.5GiB', '1000000' -> bytes (binary multiples: K=1024)."""
    m = _SIZE_RE.match(text)
    if not m:
        raise InvalidRequest(f"not a size: {text!r} (examples: 2G, 512M, 1073741824)", "memory")
    value, unit = float(m.group(1)), m.group(2).lower()
    return int(value * 1024 ** " kmgt".index(unit or " "))
