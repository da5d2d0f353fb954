"""Durations and byte sizes as people write them ("5m", "1h30m", "1300M", "4G"), parsed once.

Ollama's `keep_alive` (a request field), `--keep-alive` and `--memory-budget` (flags and
settings) all read through here, so a spelling that works in one place works in all.
A leaf: it imports nothing of edge's but its errors.
"""

from __future__ import annotations

import math
import re

from edge.errors import InvalidRequest

_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
MAX_KEEP_ALIVE_S = 10 * 365 * 86400.0  # beyond this, a number is "forever" for practical purposes

_BYTE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
               "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tb": 1 << 40,
               "tib": 1 << 40}
_BYTES = re.compile(r"(\d+(?:\.\d+)?)\s*([a-z]*)")


def parse_keep_alive(value: str | float | int, param: str = "keep_alive") -> float | None:
    """A Go duration ("5m", "1h30m", "300ms", "-1m") or a number of seconds, as Ollama reads
    `keep_alive`. Returns seconds (0: unload right after the request) or None (negative: keep
    loaded forever). InvalidRequest naming `param` for anything else."""
    if isinstance(value, bool):
        raise InvalidRequest(f"{param} must be a duration string or a number of seconds", param)
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            raise InvalidRequest(f"{param} must be a finite number", param)
        return None if value < 0 else min(float(value), MAX_KEEP_ALIVE_S)
    text = value.strip()
    sign = -1.0 if text.startswith("-") else 1.0
    body = text[1:] if text[:1] in ("+", "-") else text  # one sign at most, as Go's ParseDuration
    if re.fullmatch(r"\d+(\.\d+)?", body):  # a bare number in a string: seconds (Ollama: "0" only)
        seconds = float(body)
    else:
        pos, seconds = 0, 0.0
        for m in _PART.finditer(body):
            if m.start() != pos:
                break
            seconds += float(m.group(1)) * _UNIT_S[m.group(2)]
            pos = m.end()
        if not body or pos != len(body):
            raise InvalidRequest(
                f"{param} {value!r} is not a duration (e.g. \"5m\", \"1h30m\", \"300ms\") or seconds", param)
    if sign < 0 and seconds > 0:
        return None
    return min(seconds, MAX_KEEP_ALIVE_S)


def parse_bytes(value: str | int, param: str = "bytes") -> int:
    """"1300M", "4G", "512MiB", "1.5G" or a plain number of bytes -> bytes (binary units, as
    `free -h` and Ollama's memory figures are). InvalidRequest naming `param` otherwise."""
    if isinstance(value, bool):
        raise InvalidRequest(f"{param} must be a size such as 1300M or 4G", param)
    if isinstance(value, int):
        if value < 0:
            raise InvalidRequest(f"{param} must be >= 0", param)
        return value
    m = _BYTES.fullmatch(value.strip().lower())
    if m is None or m.group(2) not in _BYTE_UNITS:
        raise InvalidRequest(f"{param} {value!r} is not a size (e.g. 1300M, 4G, 512MiB)", param)
    return int(float(m.group(1)) * _BYTE_UNITS[m.group(2)])
