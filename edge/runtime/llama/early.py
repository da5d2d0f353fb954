"""Early weights: the start a command line made last time begins its model loads (and contexts)
before Python has imported the rest of edge.

`edge serve` spends most of its start in Python imports (settings, the store, the engine, the
HTTP stack: ~0.9 s on a 2-core VM) before it knows which file to load, then waits for llama.cpp to
map the weights, make a context and warm up. The weights load is C with the GIL released and no
Python log callback (loadlog.py), so it can run beside those imports on another core, if it can
start before them. The first thing `edge serve` does (cli.py) is therefore `begin(argv)`: if the
same command line, in the same directory with the same `EDGE_*` environment, loaded models last
time (a record in the cache directory), and each file is still the one it was, the loads start on
a thread now. A command line with no record of its own loads the `.gguf` files it names
(`gguf_words`) and the files its model names (or, naming none, the default model) resolved to at
an earlier start here (`note_name`), each with what the last start of any command line had on
that file (its context and chat head; the records: start_records.py). `Residency.open` takes a
model through `EARLY.open`, which hands over the early one when path and placement match, and
otherwise loads as before; `finish()` closes what nobody took and records what this start
loaded, for the next.

The context (KV cache and compute buffers: ~140 ms for SmolLM2's 8192 cells on that VM, most of
it clearing the cache's memory) is C without the GIL too, so where the last start recorded the
context it made on those weights, the thread makes it right after them, and `Residency.open`
takes it through `EARLY.context` when its configuration is the one asked for now (else it is
freed and made anew). It is not warmed up there: the engine thread's first decode must be its own
(OpenMP teams, kv/residency.py). Where the record holds the chat template's head (the tokens
every chat without a system message starts with), the thread then decodes them into the context
with one thread (prime.py), once every early load is done, until serve calls `hurry`; the first
chat finds them cached. The context is handed over before that: the engine's open goes on, and
only its first decode (the warm-up) waits for the priming (`LlamaContext.hold`). A start that
primed nothing early primes the head once `Residency.install` knows it (`note_head`), on a thread
of its own, while serve still imports the API and never after.

A wrong guess costs a load on the idle core and the page cache, never the result: what is handed
over is only what the host would have loaded itself. Loads that would not be quiet (a GPU build,
repacked weights: the placement depends on memory the plan has not seen yet) never start early,
nor under `-v` (the log is wanted then) or `--lazy` (nothing loads at start).
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edge.dirs import cache_dir
from edge.runtime.llama.start_records import (
    Weights,
    file_key,
    gguf_words,
    name_key,
    read_record,
    start_key,
    write_record,
)

if TYPE_CHECKING:
    from edge.runtime.llama.model import ContextConfig, LlamaContext, LlamaModel
    from edge.runtime.text.chat_template import ChatTemplate

log = logging.getLogger("edge.engine")

MAX_GUESSES = 4  # model files named on a new command line that load early, at most
SKIP_FLAGS = frozenset({"-v", "--verbose", "--lazy", "-h", "--help"})  # see the module docstring


def _positional(words: Sequence[str]) -> list[str]:
    """The words that may name models: neither an option nor, as far as can be told without the
    parser, an option's value (a word right after an option with no `=`)."""
    return [w for i, w in enumerate(words)
            if not w.startswith("-") and not (i and words[i - 1].startswith("-") and "=" not in words[i - 1])]


def _identity(path: str) -> tuple[int, int, int, int] | None:
    """`model.file_identity` (what `LlamaModel.same_file` compares), None where there is no file."""
    from edge.runtime.llama.model import file_identity

    try:
        return file_identity(path)
    except OSError:
        return None


Loader = Callable[[str, int], "LlamaModel"]


def _load_weights(path: str, n_gpu_layers: int) -> LlamaModel:
    from edge.runtime.llama.model import LlamaModel

    return LlamaModel(path, n_gpu_layers=n_gpu_layers, use_mmap=True)  # as Residency.open does


ContextMaker = Callable[["LlamaModel", dict[str, Any]], "LlamaContext"]
Checker = Callable[[str], object]
Primer = Callable[["LlamaContext", tuple[int, ...], threading.Event, bool], object]


def _make_context(model: LlamaModel, config: dict[str, Any]) -> LlamaContext:
    from edge.runtime.llama.model import ContextConfig, LlamaContext

    return LlamaContext(model, ContextConfig(**config))


def _prime(ctx: LlamaContext, head: tuple[int, ...], stop: threading.Event, first_chunk: bool) -> object:
    """The head into `ctx`, in prime.py's chunks; a first start's (no first chunk) stops at once
    when serve has already hurried."""
    from edge.runtime.llama.prime import prime

    return prime(ctx, head, stop, first_chunk=first_chunk)


def _quiet_here() -> bool:
    """Whether a mapped load on this build is quiet (loadlog.known_buffers), so it runs without
    the GIL and its placement does not wait for the memory plan."""
    from edge.runtime.llama.backend import probe_backends
    from edge.runtime.llama.loadlog import ensure_backend, known_buffers
    from edge.runtime.llama.model import extra_buffers

    if known_buffers(probe_backends().gpu_offload, extra_buffers(), True, False) is None:
        return False
    ensure_backend()  # here, before the thread: the log route is set once, by this thread
    return True


class EarlyWeights:
    """The early loads of one process: `begin`, then `open` for each load, then `finish`."""

    def __init__(self, root: Path | None = None, loader: Loader = _load_weights,
                 quiet_here: Callable[[], bool] = _quiet_here,
                 contexts: ContextMaker = _make_context, primer: Primer = _prime) -> None:
        self._root = root  # None: cache_dir()/starts, read when first needed
        self._loader = loader
        self._contexts = contexts
        self._primer = primer
        self._hurry = threading.Event()  # set by serve once its imports are done: priming stops
        self._quiet_here = quiet_here
        self._lock = threading.Lock()
        self._loaded = threading.Condition(self._lock)  # notified as each early load ends
        self._key: str | None = None
        self._recorded: list[Weights] = []
        self._early: dict[tuple[str, int], LlamaModel | BaseException] = {}
        self._thread: threading.Thread | None = None
        self._pending: set[tuple[str, int]] = set()  # early loads not ended yet
        self._ctx: dict[int, tuple[dict[str, Any], LlamaContext | None]] = {}  # id(model) -> early context
        self._ctx_pending: set[int] = set()  # id(model) of early weights whose context is being made
        self._seen: list[Weights] = []  # what this start loaded, recorded by finish()
        self._finished = False
        self._late: list[threading.Thread] = []  # primings of a start nothing was primed for (note_head)
        self._where: tuple[str, dict[str, str]] = ("", {})  # begin()'s directory and environment
        self._names: list[tuple[str | None, str]] = []  # note_name()
        self._check: Checker | None = None  # begin()'s
        self._unchecked: set[str] = set()  # guessed files no start loaded: `_check`ed before loading
        self._guessed: dict[str, str] = {}  # path -> why, early loads for a command line not seen
        self.handed_over = 0  # early loads taken by open() (logs, tests)
        self.contexts_handed_over = 0  # early contexts taken by context()

    @property
    def root(self) -> Path:
        return self._root or cache_dir() / "starts"

    def begin(self, argv: Sequence[str], cwd: str | None = None, env: dict[str, str] | None = None,
              check: Checker | None = None) -> int:
        """Start the loads the last start with this command line made, or those `_guess` finds;
        how many started. `check` raises for a file edge's GGUF checks refuse (edge.gguf, above
        the runtime): a file no start loaded is checked first on the early thread, and without
        `check` it does not load early at all (llama.cpp aborts the process on some bad files)."""
        if SKIP_FLAGS.intersection(argv):
            return 0
        self._check = check
        cwd = cwd or os.getcwd()
        env = dict(os.environ) if env is None else env
        self._key, self._where = start_key(argv, cwd, env), (cwd, env)
        atexit.register(self._join)  # a start that fails first exits with no load or priming mid-flight
        self._recorded = read_record(self.root, self._key)
        todo = [w for w in self._recorded if _identity(w.path) == w.file_id] or self._guess(argv, cwd, env)
        if not todo or not self._quiet_here():
            return 0
        self._pending = {(w.path, w.n_gpu_layers) for w in todo}
        self._thread = threading.Thread(target=self._run, args=(todo,), name="edge-early-load", daemon=True)
        self._thread.start()
        return len(todo)

    def _guess(self, argv: Sequence[str], cwd: str, env: dict[str, str]) -> list[Weights]:
        """A command line not seen before: the model files it names, and those its model names
        (or, naming none, the default model) resolved to at a start here; each as the last start
        of any command line had it (its file record: context and chat head), else weights only."""
        named = gguf_words(argv, cwd)
        named += [w.path for word in argv if not word.startswith("-")
                  for w in read_record(self.root, name_key(word, cwd, env))]
        why = "named on the command line"
        if not named and not _positional(argv[1:]):  # `serve` and options only: the default model
            named = [w.path for w in read_record(self.root, name_key(None, cwd, env))]
            why = "the default model here"
        todo: list[Weights] = []
        for path in list(dict.fromkeys(named))[:MAX_GUESSES]:
            file_id = _identity(path)
            if file_id is not None:
                known = [w for w in read_record(self.root, file_key(path, file_id)) if w.file_id == file_id]
                if not known and self._check is None:
                    continue  # never loaded by a start, and nothing here to check it with
                todo.append(known[0] if known else Weights(path, 0, file_id))  # 0: a quiet build's
                self._guessed[path] = why
                if not known:
                    self._unchecked.add(path)
        return todo

    def note_name(self, name: str | None, path: str) -> None:
        """The file a model name given at start (None: the default model) resolved to; recorded
        by `finish` where this start loaded it, for a command line never run that names it."""
        with self._lock:
            if self._key is not None and not self._finished:
                self._names.append((name, path))

    def _run(self, todo: list[Weights]) -> None:
        primes: list[tuple[LlamaContext, tuple[int, ...]]] = []  # after every load: none waits
        for w in todo:
            try:
                if w.path in self._unchecked and self._check is not None:
                    self._check(w.path)  # raises for a file the host will refuse before it loads
                got: LlamaModel | BaseException = self._loader(w.path, w.n_gpu_layers)
            except BaseException as exc:  # handed to open(), which loads again and reports it
                got = exc
            with self._loaded:
                self._early[(w.path, w.n_gpu_layers)] = got
                self._pending.discard((w.path, w.n_gpu_layers))
                make = w.context is not None and not isinstance(got, BaseException) and not self._finished
                if make:
                    self._ctx_pending.add(id(got))
                self._loaded.notify_all()
            if make:
                ctx = self._early_context(got, w.context, bool(w.head))  # type: ignore[arg-type]
                if ctx is not None:
                    primes.append((ctx, w.head))
        for ctx, head in primes:
            self._prime(ctx, head)

    def _early_context(self, model: LlamaModel, config: dict[str, Any], hold: bool) -> LlamaContext | None:
        """Make the context and hand it over; held (returned) for a priming still to come."""
        try:
            ctx: LlamaContext | None = self._contexts(model, config)
        except BaseException:  # context() makes it again and reports what fails
            ctx = None
        if ctx is not None and hold:
            ctx.hold()  # its first decode elsewhere waits for the priming
        with self._loaded:
            self._ctx[id(model)] = (config, ctx)
            self._ctx_pending.discard(id(model))
            self._loaded.notify_all()
        return ctx if hold else None

    def _prime(self, ctx: LlamaContext, head: tuple[int, ...], first_chunk: bool = True) -> None:
        try:
            self._primer(ctx, head, self._hurry, first_chunk)
        except BaseException as exc:  # a head start lost, nothing else: an empty context
            log.debug("chat head not primed: %s", exc)
            ctx.clear()
        finally:
            ctx.release()

    def hurry(self) -> None:
        """The server is about to listen: priming stops after its current (or first) chunk."""
        self._hurry.set()

    @property
    def recording(self) -> bool:
        """Whether this start's loads are still being recorded (`note_head` is heard)."""
        return self._key is not None and not self._finished

    def note_head(self, model: LlamaModel, template: ChatTemplate | None,
                  ctx: LlamaContext | None = None) -> None:
        """Record the head of `model`'s chat `template` (prime.chat_head; None: nothing to prime)
        for the next start; and where the early thread primed nothing into `ctx` (a first start),
        prime it now on a thread of its own until serve `hurry`s, none if it already did."""
        from edge.runtime.llama.prime import chat_head

        head = () if template is None else chat_head(template, model)
        with self._lock:
            for i in range(len(self._seen) - 1, -1, -1):
                if self._seen[i].path == model.path and not self._finished:
                    self._seen[i] = replace(self._seen[i], head=tuple(head))
                    break
        if ctx is None or not head or ctx.primed or ctx.held or self._hurry.is_set():
            return
        ctx.hold()  # the engine's first decode waits for it, as for an early priming
        late = threading.Thread(target=self._prime, args=(ctx, head, False), name="edge-start-prime",
                                daemon=True)
        self._late.append(late)
        late.start()

    def _join(self) -> None:
        for thread in [self._thread, *self._late]:
            if thread is not None:
                thread.join()

    def open(self, path: str, n_gpu_layers: int) -> LlamaModel:
        """The weights `Residency.open` needs: the early load of this file and placement when
        there is one (waiting for that load only), else a load now."""
        with self._loaded:
            if self._key is not None and not self._finished:
                file_id = _identity(path)
                if file_id is not None:
                    self._seen.append(Weights(path, n_gpu_layers, file_id))
            self._loaded.wait_for(lambda: (path, n_gpu_layers) not in self._pending)
            got = self._early.pop((path, n_gpu_layers), None)
        if got is not None and not isinstance(got, BaseException) and got.same_file():
            self.handed_over += 1
            why = self._guessed.get(path, "the last start with this command line loaded them")
            log.info("weights of %s loaded early, beside the start's imports (%s)", Path(path).name, why)
            return got
        if got is not None and not isinstance(got, BaseException):
            self.drop_context(got)
            got.close()  # the file changed under it
        return self._loader(path, n_gpu_layers)

    def _take_context(self, model: LlamaModel) -> tuple[dict[str, Any] | None, LlamaContext | None]:
        """(its configuration, the context) made early on `model`, once it is made; (None, None)."""
        with self._loaded:
            self._loaded.wait_for(lambda: id(model) not in self._ctx_pending)
            return self._ctx.pop(id(model), (None, None))

    def drop_context(self, model: LlamaModel) -> None:
        """Free the context made early on `model`, if any: before weights that are not handed
        over, or that a failed open closes before it asked for its context, are freed."""
        _, ctx = self._take_context(model)
        if ctx is not None:
            ctx.close()

    def context(self, model: LlamaModel, config: ContextConfig) -> LlamaContext:
        """The context `Residency.open` makes on `model`: the early one when it was made on these
        very weights with this configuration (waiting for it only), else one made now."""
        wanted = asdict(config)
        with self._loaded:
            if self._key is not None and not self._finished:
                for i in range(len(self._seen) - 1, -1, -1):
                    if self._seen[i].path == model.path:
                        self._seen[i] = replace(self._seen[i], context=wanted)
                        break
        made, ctx = self._take_context(model)
        if ctx is not None and made == wanted:
            self.contexts_handed_over += 1
            log.info("context of %s made early, on its early weights", Path(model.path).name)
            return ctx
        if ctx is not None:
            ctx.close()  # made for another configuration (the plan or a verdict changed)
        return self._contexts(model, wanted)

    def finish(self) -> None:
        """The start's loads are done: close early loads nobody took, record what was loaded."""
        self._join()
        with self._lock:
            self._finished = True
            left, self._early = list(self._early.values()), {}
            ctxs, self._ctx = [c for _, c in self._ctx.values() if c is not None], {}
            seen, key = list(self._seen), self._key
        for ctx in ctxs:  # before the weights they were made on
            ctx.close()
        for got in left:
            if not isinstance(got, BaseException):
                got.close()
        if key is not None and seen and seen != self._recorded:
            write_record(self.root, key, seen)
        for w in seen:  # what another command line naming the file guesses (_guess)
            if w.context is not None:
                write_record(self.root, file_key(w.path, w.file_id), [w])
        cwd, env = self._where
        for name, path in self._names:  # ... or naming the model (noted only with a key)
            loads = [Weights(w.path, w.n_gpu_layers, w.file_id) for w in seen if w.path == path]
            if loads:
                write_record(self.root, name_key(name, cwd, env), loads[:1])


EARLY = EarlyWeights()  # this process's: cli.py begins it, Residency.open takes from it, serve finishes it
