"""Reading sysfs/procfs files one at a time: each failure becomes one error line, never an exception.

Every telemetry reader takes a `Reader` (a function from path to text) so tests run
on fake trees and can make one file fail with ENODATA while the others still read.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from pathlib import Path

Reader = Callable[[Path], str]


def read_file(path: Path) -> str:
    """Production reader: one small sysfs/procfs file."""
    with open(path, encoding="ascii", errors="replace") as fh:
        return fh.read()


def _os_reason(exc: OSError) -> str:
    code = errno.errorcode.get(exc.errno or 0)
    text = exc.strerror or str(exc)
    return f"{code} ({text})" if code else text


class ReadLog:
    """Reads files and turns each failure into one error line instead of an exception.

    `cache` holds files that do not change while the machine runs (zone types,
    trip points, labels, cpuinfo_max_freq): a Jetson sample then costs ~40
    file reads instead of ~160. Missing files are cached as None; failed reads
    are never cached, so a flaky sensor is retried (and reported) every time.
    """

    def __init__(self, reader: Reader = read_file, cache: dict[Path, str | None] | None = None) -> None:
        self.reader = reader
        self.cache = cache
        self.errors: list[str] = []

    def note(self, line: str) -> None:
        self.errors.append(line)

    def text(self, path: Path, *, required: bool = True, static: bool = False) -> str | None:
        """File content stripped of whitespace and NULs; None when missing or unreadable."""
        cache = self.cache if static else None
        if cache is not None and path in cache:
            value = cache[path]
            if value is None and required:
                self.errors.append(f"{path}: missing")
            return value
        try:
            value = self.reader(path).strip().strip("\x00").strip()
        except FileNotFoundError:
            if cache is not None:
                cache[path] = None
            if required:
                self.errors.append(f"{path}: missing")
            return None
        except OSError as exc:
            self.errors.append(f"{path}: {_os_reason(exc)}")
            return None
        if cache is not None:
            cache[path] = value
        return value

    def integer(self, path: Path, *, required: bool = True, static: bool = False) -> int | None:
        raw = self.text(path, required=required, static=static)
        if raw is None:
            return None
        try:
            return int(raw.split()[0]) if raw else int(raw)
        except ValueError:
            self.errors.append(f"{path}: not a number: {raw[:40]!r}")
            return None

    def milli(self, path: Path, *, required: bool = True, static: bool = False) -> float | None:
        """A milli-unit integer file (milli-°C, mV, mA) as units."""
        value = self.integer(path, required=required, static=static)
        return None if value is None else value / 1000.0


def numbered(parent: Path, prefix: str) -> list[Path]:
    """`prefix0, prefix1, ...` under parent, in numeric order; [] when parent is absent."""
    try:
        entries = [
            p for p in parent.iterdir() if p.name.startswith(prefix) and p.name[len(prefix) :].isdigit()
        ]
    except OSError:
        return []
    return sorted(entries, key=lambda p: int(p.name[len(prefix) :]))
