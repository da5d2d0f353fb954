"""The chat template's head primed on the early thread (runtime/llama/early.py, prime.py): a start
records the head of the template it served, the next start with that command line decodes it
into the early context after handing the context over, and its first decode elsewhere waits."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from edge.runtime.llama import prime as prime_mod
from edge.runtime.llama.early import EarlyWeights
from tests.unit.test_early_context import CFG
from tests.unit.test_early_weights import ARGV, ENV, _Loader, _model

HEAD = (1, 30, 31, 32, 9, 10, 11, 12, 13)


class _Ctx:
    """A context as LlamaContext holds one for another thread: `close` waits for `release`."""

    def __init__(self, model: Any, config: dict[str, Any]) -> None:
        self.model, self.config = model, config
        self.primed: tuple[int, ...] = ()
        self.held: threading.Event | None = None
        self.closed = self.cleared = False

    def hold(self) -> None:
        self.held = threading.Event()

    def release(self) -> None:
        assert self.held is not None
        self.held.set()

    def clear(self) -> None:
        self.cleared, self.primed = True, ()

    def close(self) -> None:
        assert self.held is None or self.held.wait(10), "freed while another thread decodes into it"
        assert not self.model.closed, "a context must be freed before its weights"
        self.closed = True


class _Primer:
    """Decodes nothing: records what it was asked, waits for `gate` when given, may fail."""

    def __init__(self, gate: threading.Event | None = None, fail: bool = False) -> None:
        self.gate, self.fail = gate, fail
        self.calls: list[tuple[tuple[int, ...], str, threading.Event]] = []
        self.first_chunks: list[bool] = []
        self.done = threading.Event()

    def __call__(self, ctx: _Ctx, head: tuple[int, ...], stop: threading.Event,
                 first_chunk: bool = True) -> None:
        self.calls.append((head, threading.current_thread().name, stop))
        self.first_chunks.append(first_chunk)
        try:
            if self.gate is not None:
                assert self.gate.wait(10)
            if self.fail:
                raise RuntimeError("decode failed")
            ctx.primed = head if not stop.is_set() else head[:prime_mod.CHUNK_TOKENS if first_chunk else 0]
        finally:
            self.done.set()


def _early(root: Path, primer: _Primer) -> EarlyWeights:
    return EarlyWeights(root, _Loader(), quiet_here=lambda: True,  # type: ignore[arg-type]
                        contexts=_Ctx, primer=primer)  # type: ignore[arg-type]


def _restart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, primer: _Primer,
             head: tuple[int, ...] = HEAD) -> tuple[EarlyWeights, str]:
    """A recorded first start, then the next one with `primer`, begun: (its EarlyWeights, the model)."""
    root, path = tmp_path / "starts", _model(tmp_path)
    _recorded_start(root, path, monkeypatch, head)
    early = _early(root, primer)
    early.begin(ARGV, "/srv", ENV)
    return early, path


def _gated_restart(tmp_path: Path,
                   monkeypatch: pytest.MonkeyPatch) -> tuple[EarlyWeights, str, threading.Event, _Primer]:
    """`_restart` with a primer that waits for the returned gate: (early, model path, gate, primer)."""
    gate = threading.Event()
    primer = _Primer(gate)
    early, path = _restart(tmp_path, monkeypatch, primer)
    return early, path, gate, primer


def _recorded_start(root: Path, path: str, monkeypatch: pytest.MonkeyPatch,
                    head: tuple[int, ...] = HEAD) -> None:
    """A first start: loads, makes its context and notes the template's head (Residency.install)."""
    monkeypatch.setattr(prime_mod, "chat_head", lambda template, model: head)
    early = _early(root, _Primer())
    early.begin(ARGV, "/srv", ENV)
    model = early.open(path, 0)
    early.context(model, CFG)
    assert early.recording
    early.note_head(model, template=object())  # type: ignore[arg-type]
    early.finish()
    assert not early.recording


def test_the_head_is_recorded_and_primed_by_the_next_start_on_the_early_thread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root, path = tmp_path / "starts", _model(tmp_path)
    _recorded_start(root, path, monkeypatch)
    (record,) = root.glob("*.json")  # the command line's (the file's own is in files/)
    assert json.loads(record.read_text())["models"][0]["head"] == list(HEAD)
    primer = _Primer()
    early = _early(root, primer)
    early.begin(ARGV, "/srv", ENV)
    ctx = early.context(early.open(path, 0), CFG)
    assert primer.done.wait(10)
    assert [(h, t) for h, t, _ in primer.calls] == [(HEAD, "edge-early-load")]
    assert ctx.primed == HEAD and ctx.held is not None and ctx.held.is_set()
    early.finish()


def test_the_context_is_handed_over_while_it_is_primed_and_hurry_cuts_the_priming_short(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    early, path, gate, primer = _gated_restart(tmp_path, monkeypatch)
    ctx = early.context(early.open(path, 0), CFG)  # handed over with the primer still at work
    assert ctx.held is not None and not ctx.held.is_set() and not primer.done.is_set()
    early.hurry()  # serve's API is imported
    gate.set()
    assert ctx.held.wait(10) and ctx.primed == HEAD[:prime_mod.CHUNK_TOKENS]
    assert primer.calls[0][2].is_set()
    early.finish()


def test_a_priming_that_fails_leaves_an_empty_context_that_still_serves(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    early, path = _restart(tmp_path, monkeypatch, _Primer(fail=True))
    ctx = early.context(early.open(path, 0), CFG)
    assert ctx.held is not None and ctx.held.wait(10)
    assert ctx.cleared and ctx.primed == () and early.contexts_handed_over == 1
    early.finish()


def test_an_early_context_freed_unused_waits_for_its_priming(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    early, path, gate, primer = _gated_restart(tmp_path, monkeypatch)
    model = early.open(path, 0)
    dropping = threading.Thread(target=early.drop_context, args=(model,))
    dropping.start()  # _Ctx.close waits for the priming's release, and asserts that it came
    assert not primer.done.is_set()
    gate.set()
    dropping.join(10)
    assert not dropping.is_alive() and primer.done.is_set()
    model.close()
    early.finish()


def test_no_head_no_priming(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A template without a shared head (or a model with a draft: Residency.install passes None)."""
    primer = _Primer()
    early, path = _restart(tmp_path, monkeypatch, primer, head=())
    ctx = early.context(early.open(path, 0), CFG)
    early.finish()
    assert primer.calls == [] and ctx.held is None and ctx.primed == ()


def test_every_early_load_comes_before_any_priming(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two models named at start: the second one's weights do not wait for the first one's head."""
    root, paths = tmp_path / "starts", [_model(tmp_path, "a.gguf"), _model(tmp_path, "b.gguf")]
    monkeypatch.setattr(prime_mod, "chat_head", lambda template, model: HEAD)
    order: list[str] = []
    loader = _Loader()

    def load(path: str, n_gpu_layers: int) -> Any:
        order.append(f"load {Path(path).name}")
        return loader(path, n_gpu_layers)

    class Primer(_Primer):
        def __call__(self, ctx: _Ctx, head: tuple[int, ...], stop: threading.Event,
                     first_chunk: bool = True) -> None:
            order.append(f"prime {Path(ctx.model.path).name}")
            super().__call__(ctx, head, stop, first_chunk)

    for primer in (_Primer(), Primer()):
        early = EarlyWeights(root, load, quiet_here=lambda: True, contexts=_Ctx,  # type: ignore[arg-type]
                             primer=primer)  # type: ignore[arg-type]
        early.begin(ARGV, "/srv", ENV)
        for path in paths:
            model = early.open(path, 0)
            early.context(model, CFG)
            early.note_head(model, template=object())  # type: ignore[arg-type]
        early.finish()
    assert order[-4:] == ["load a.gguf", "load b.gguf", "prime a.gguf", "prime b.gguf"]


def _first_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                 primer: _Primer) -> tuple[EarlyWeights, str]:
    """A start of a command line never seen, naming no file: nothing loads or primes early."""
    monkeypatch.setattr(prime_mod, "chat_head", lambda template, model: HEAD)
    early = _early(tmp_path / "starts", primer)
    assert early.begin(ARGV, "/srv", ENV) == 0
    return early, _model(tmp_path)


def test_a_first_start_primes_its_context_on_a_thread_until_serve_hurries(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing recorded: the head is known once the template is (Residency.install), and is primed
    then, beside the API's imports, while the engine's first decode waits (`hold`)."""
    gate = threading.Event()
    primer = _Primer(gate)
    early, path = _first_start(tmp_path, monkeypatch, primer)
    model = early.open(path, 0)
    ctx = early.context(model, CFG)
    early.note_head(model, template=object(), ctx=ctx)  # type: ignore[arg-type]
    assert ctx.held is not None and not ctx.held.is_set()  # note_head returned; priming goes on
    gate.set()
    assert ctx.held.wait(10) and ctx.primed == HEAD
    assert [t for _, t, _ in primer.calls] == ["edge-start-prime"] and primer.first_chunks == [False]
    early.finish()


def test_a_first_start_whose_api_is_imported_already_primes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After `hurry` a priming would only delay the first chat: it evaluates the head faster."""
    primer = _Primer()
    early, path = _first_start(tmp_path, monkeypatch, primer)
    model = early.open(path, 0)
    ctx = early.context(model, CFG)
    early.hurry()
    early.note_head(model, template=object(), ctx=ctx)  # type: ignore[arg-type]
    early.finish()
    assert primer.calls == [] and ctx.held is None and ctx.primed == ()


def test_a_context_primed_or_being_primed_early_is_not_primed_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    early, path, gate, primer = _gated_restart(tmp_path, monkeypatch)
    model = early.open(path, 0)
    ctx = early.context(model, CFG)
    early.note_head(model, template=object(), ctx=ctx)  # type: ignore[arg-type]  # still priming early
    gate.set()
    assert primer.done.wait(10) and ctx.primed == HEAD
    early.note_head(model, template=object(), ctx=ctx)  # type: ignore[arg-type]  # primed already
    early.finish()
    assert [t for _, t, _ in primer.calls] == ["edge-early-load"]


def test_a_new_command_line_naming_a_recorded_file_makes_and_primes_its_context_early(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another port, the same model file: its context and head come from the file's record."""
    root, path = tmp_path / "starts", _model(tmp_path)
    _recorded_start(root, path, monkeypatch)
    primer = _Primer()
    early = _early(root, primer)
    assert early.begin(["serve", path, "--port", "9090"], "/srv", ENV) == 1
    ctx = early.context(early.open(path, 0), CFG)
    assert primer.done.wait(10) and ctx.primed == HEAD
    assert early.handed_over == early.contexts_handed_over == 1
    early.finish()
