"""Which model a request names: store names, file names, stems, paths, Ollama's ":latest" tag.

The index is the model store's manifest plus the files named on the command line; it is
read again when a name misses (a pull since may have added it), so a model `/api/pull` just
fetched is servable at once. A miss is a 404 that names the closest known models.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from edge.errors import ModelNotFound


@dataclass(frozen=True)
class ModelRef:
    """One servable model: its key (the store name, or a file's stem), file and other names."""

    key: str
    path: Path
    aliases: frozenset[str] = field(default_factory=frozenset)

    @property
    def names(self) -> frozenset[str]:
        return self.aliases | {self.key}


def _stem(path: Path) -> str:
    return path.name[: -len(".gguf")] if path.name.lower().endswith(".gguf") else path.name


def ref_for_file(path: Path, given: str | None = None) -> ModelRef:
    """A model named by its file (a path on the command line)."""
    path = path.resolve()
    stem = _stem(path)
    names = {str(path), path.name, stem, stem.lower(), *([given] if given else [])}
    return ModelRef(stem, path, frozenset(names))


def ref_for_store(name: str, path: Path) -> ModelRef:
    path = Path(path)
    return ModelRef(name, path, frozenset({name, path.name, _stem(path), str(path), str(path.resolve())}))


class ModelNames:
    """name -> ModelRef over the store (re-read on a miss) and the files given at start."""

    def __init__(self, list_store: Callable[[], Iterable[tuple[str, Path]]], given: Iterable[ModelRef] = ()):
        self._list_store = list_store
        self._given = {r.key: r for r in given}
        self._refs: dict[str, ModelRef] = {}
        self.refresh()

    def refresh(self) -> None:
        refs = {name: ref_for_store(name, path) for name, path in self._list_store()}
        for key, ref in self._given.items():
            same = [r for r in refs.values() if r.path.resolve() == ref.path.resolve()]
            if same:  # a store file named by its path: one model, all its names
                old = same[0]
                refs[old.key] = ModelRef(old.key, old.path, old.aliases | ref.names)
            else:
                refs[key] = ref
        self._refs = refs

    def given_keys(self) -> list[str]:
        """The keys of the models named at start, in order (a store file keeps its store name)."""
        out = []
        for ref in self._given.values():
            same = [r.key for r in self._refs.values() if r.path.resolve() == ref.path.resolve()]
            out.append(same[0] if same else ref.key)
        return out

    def all(self) -> list[ModelRef]:
        return sorted(self._refs.values(), key=lambda r: r.key)

    def lookup(self, name: str) -> ModelRef | None:
        for candidate in (name, name.removesuffix(":latest")):
            for ref in self._refs.values():
                if candidate in ref.names:
                    return ref
        return None

    def resolve(self, name: str) -> ModelRef:
        """The model `name` means; ModelNotFound (404) naming the closest models when none."""
        ref = self.lookup(name)
        if ref is None:
            self.refresh()
            ref = self.lookup(name)
        if ref is None:
            keys = [r.key for r in self.all()]
            close = difflib.get_close_matches(name.removesuffix(":latest"), keys, n=3, cutoff=0.4)
            hint = f"did you mean {', '.join(close)}?" if close else ""
            raise ModelNotFound(name, f"{hint} servable models: {', '.join(keys) or 'none'}".strip())
        return ref
