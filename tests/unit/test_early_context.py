"""Early contexts (runtime/llama/early.py): where the last start with this command line made a
context on weights it loaded, the next start makes it on the early thread right after those
weights, and `context()` hands it over only for the very weights and configuration asked for."""

from __future__ import annotations

import threading
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from edge.runtime.llama.early import EarlyWeights
from edge.runtime.llama.model import ContextConfig
from tests.unit.test_early_weights import ARGV, ENV, _Loader, _model

CFG = ContextConfig(n_ctx=8192, n_seq_max=4, n_threads=2, n_outputs_max=68)


class _Ctx:
    def __init__(self, model: Any, config: dict[str, Any]) -> None:
        self.model, self.config = model, config
        self.thread = threading.current_thread().name
        self.closed = False

    def close(self) -> None:
        assert not self.model.closed, "a context must be freed before its weights"
        self.closed = True


class _Contexts:
    def __init__(self, fail: bool = False) -> None:
        self.made: list[_Ctx] = []
        self.fail = fail

    def __call__(self, model: Any, config: dict[str, Any]) -> _Ctx:
        if self.fail and threading.current_thread().name == "edge-early-load":
            raise RuntimeError("no memory for the KV cache")
        c = _Ctx(model, config)
        self.made.append(c)
        return c


def _early(root: Path, contexts: _Contexts, loader: _Loader | None = None) -> EarlyWeights:
    return EarlyWeights(root, loader or _Loader(), quiet_here=lambda: True,  # type: ignore[arg-type]
                        contexts=contexts)  # type: ignore[arg-type]


def _start(root: Path, path: str, contexts: _Contexts, config: ContextConfig = CFG) -> tuple[Any, Any]:
    early = _early(root, contexts)
    early.begin(ARGV, "/srv", ENV)
    model = early.open(path, 0)
    ctx = early.context(model, config)
    early.finish()
    return early, ctx


def test_the_next_start_makes_the_context_early_and_hands_it_over(tmp_path: Path) -> None:
    root, path = tmp_path / "starts", _model(tmp_path)
    first, ctx = _start(root, path, _Contexts())
    assert first.contexts_handed_over == 0 and ctx.thread == threading.current_thread().name
    contexts = _Contexts()
    second, ctx = _start(root, path, contexts)
    assert second.contexts_handed_over == 1 and ctx.thread == "edge-early-load"
    assert ctx.config == asdict(CFG) and not ctx.closed and len(contexts.made) == 1


def test_another_configuration_frees_the_early_context_and_makes_its_own(tmp_path: Path) -> None:
    root, path = tmp_path / "starts", _model(tmp_path)
    _start(root, path, _Contexts())
    contexts = _Contexts()
    smaller = replace(CFG, n_ctx=4096)  # the plan had less memory this time
    early, ctx = _start(root, path, contexts, smaller)
    assert early.contexts_handed_over == 0 and ctx.config == asdict(smaller)
    assert [c.closed for c in contexts.made] == [True, False]  # the early one freed
    assert _start(root, path, _Contexts(), smaller)[0].contexts_handed_over == 1  # recorded anew


def test_a_context_that_fails_early_is_made_again_where_its_error_is_reported(tmp_path: Path) -> None:
    root, path = tmp_path / "starts", _model(tmp_path)
    _start(root, path, _Contexts())
    contexts = _Contexts(fail=True)
    early, ctx = _start(root, path, contexts)
    assert early.contexts_handed_over == 0 and ctx.thread == threading.current_thread().name


def test_an_early_context_nobody_takes_is_freed_before_its_weights(tmp_path: Path) -> None:
    root, path = tmp_path / "starts", _model(tmp_path)
    _start(root, path, _Contexts())
    contexts, loader = _Contexts(), _Loader()
    early = _early(root, contexts, loader)
    assert early.begin(ARGV, "/srv", ENV) == 1
    early._join()  # the load and its context are done; this start never asks for them
    early.finish()
    assert [c.closed for c in contexts.made] == [True] and loader.made[0].closed


def test_weights_loaded_anew_never_get_the_early_context(tmp_path: Path) -> None:
    root, path = tmp_path / "starts", _model(tmp_path)
    _start(root, path, _Contexts())
    contexts, loader = _Contexts(), _Loader()
    early = _early(root, contexts, loader)
    early.begin(ARGV, "/srv", ENV)
    early._join()
    loader.made[0].same = False  # the file changed while it loaded: open() loads it again
    model = early.open(path, 0)
    ctx = early.context(model, CFG)
    assert ctx.model is model and early.contexts_handed_over == 0
    early.finish()
    assert contexts.made[0].closed and not ctx.closed


def test_an_open_that_fails_before_its_context_frees_the_early_one_before_the_weights(tmp_path: Path) -> None:
    """Residency.open's failure path between the weights and the context (kv/residency.py):
    `drop_context`, then the weights' close; a context freed after its weights would be a
    use-after-free in llama.cpp (`_Ctx.close` asserts the order)."""
    root, path = tmp_path / "starts", _model(tmp_path)
    _start(root, path, _Contexts())
    contexts = _Contexts()
    early = _early(root, contexts)
    early.begin(ARGV, "/srv", ENV)
    model = early.open(path, 0)
    early.drop_context(model)
    model.close()
    early.finish()
    assert [c.closed for c in contexts.made] == [True]
