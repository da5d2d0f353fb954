"""Where each setting's value came from: default, profile, file, environment or flag.

A box that answers differently after a restart was usually started differently: a flag left
out of a unit file, an `EDGE_*` variable set in one shell. The deployment record of every start
(`commands/deployments.py`) therefore keeps each effective value with its origin.
`commands/_common.settings_from_args` works the origins out once, from the same flags, file and
environment the settings were read from (precedence as in `config.py`: flag > environment >
file > default); a field the settings leave to the device profile shows the profile's value.
Imports nothing of edge's but the contracts, so `config.py` and the commands can both use it.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from enum import Enum
from pathlib import Path
from typing import Any

from edge.contracts.device import DeviceProfile

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DEFAULT, PROFILE, FILE, ENVIRONMENT, FLAG = "default", "profile", "file", "environment", "flag"
ENV_PREFIX = "EDGE_"
SECRET_FIELDS = frozenset({"api_key"})  # recorded as set or not, never the value
# settings field -> the DeviceProfile field that decides it while the setting is left unset
PROFILE_FIELDS = {
    "threads": "default_threads",
    "memory_reserve_bytes": "memory_reserve_bytes",
    "gpu_layers": "gpu_layers",
    "power_budget_w": "power_budget_w",
    "battery_power_budget_w": "battery_power_budget_w",
}
_UNSET_BY_DEFAULT = (None, "auto")  # values that leave the decision to the profile


def toml_keys(path: Path | None) -> set[str]:
    """Top-level keys of the settings file (none when it is absent or unreadable: the settings
    themselves report a broken file)."""
    if path is None:
        return set()
    try:
        with path.open("rb") as fh:
            return set(tomllib.load(fh))
    except (OSError, tomllib.TOMLDecodeError):
        return set()


def field_origins(fields: Iterable[str], flags: Mapping[str, Any], file_keys: Iterable[str],
                  env: Mapping[str, str]) -> dict[str, str]:
    """Origin of every field: a flag given (not None) beats an `EDGE_*` variable (any case, as
    pydantic-settings reads them) beats a key of the settings file beats the field's default."""
    env_names = {k.upper() for k in env}
    in_file = set(file_keys)
    out = {}
    for name in fields:
        if flags.get(name) is not None:
            out[name] = FLAG
        elif f"{ENV_PREFIX}{name}".upper() in env_names:
            out[name] = ENVIRONMENT
        elif name in in_file:
            out[name] = FILE
        else:
            out[name] = DEFAULT
    return out


def plain(value: Any) -> Any:
    """A JSON-safe form of a setting's value (paths and enums as strings)."""
    if isinstance(value, (list, tuple, set, frozenset)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    return value


def effective(values: Mapping[str, Any], origins: Mapping[str, str],
              profile: DeviceProfile | None) -> dict[str, dict[str, Any]]:
    """{field: {"value", "from"}} for a record: a default left to the device profile shows the
    profile's value (from "profile"), the profile's own name when it was detected, and secrets
    only as "<set>"."""
    out: dict[str, dict[str, Any]] = {}
    for name, value in values.items():
        origin = origins.get(name, DEFAULT)
        if origin == DEFAULT and profile is not None and value in _UNSET_BY_DEFAULT:
            if name == "profile":
                value, origin = profile.name, PROFILE
            elif name in PROFILE_FIELDS and getattr(profile, PROFILE_FIELDS[name]) is not None:
                value, origin = getattr(profile, PROFILE_FIELDS[name]), PROFILE
        if name in SECRET_FIELDS and value is not None:
            value = "<set>"
        out[name] = {"value": plain(value), "from": origin}
    return out
