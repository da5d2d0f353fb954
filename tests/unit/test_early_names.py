"""Early weights for a command line never run that names a model from the store (or none: the
default model): the file that name resolved to at an earlier start here loads early, with the
context its file record holds (runtime/llama/early.py, start_records.py)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from edge.runtime.llama.early import EarlyWeights
from edge.runtime.llama.start_records import name_key, read_record
from tests.unit.test_early_context import CFG, _Ctx
from tests.unit.test_early_weights import ENV, _Loader, _model


def _early(root: Path, loader: _Loader) -> EarlyWeights:
    return EarlyWeights(root, loader, quiet_here=lambda: True, contexts=_Ctx)  # type: ignore[arg-type]


def _start(root: Path, argv: list[str], names: dict[str | None, str], loads: list[str]) -> _Loader:
    """A start of `argv` in /srv whose host resolved `names` and loaded `loads` (with a context)."""
    loader = _Loader()
    early = _early(root, loader)
    early.begin(argv, "/srv", ENV)
    for name, path in names.items():
        early.note_name(name, path)
    for path in loads:
        early.context(early.open(path, 0), CFG)
    early.finish()
    return loader


def test_a_new_command_line_naming_a_model_loads_the_file_that_name_had(tmp_path: Path) -> None:
    root, path = tmp_path / "starts", _model(tmp_path, "smollm2.gguf")
    _start(root, ["serve", "smollm2"], {"smollm2": path}, [path])
    loader = _start(root, ["serve", "smollm2", "--port", "9000"], {"smollm2": path}, [path])
    assert [(p, t) for p, _, t in loader.calls] == [(path, "edge-early-load")]  # and only there
    assert loader.made[0].closed is False  # handed over, not a leftover


def test_a_new_command_line_naming_no_model_loads_the_default_models_file(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root, path = tmp_path / "starts", _model(tmp_path, "default.gguf")
    _start(root, ["serve"], {None: path}, [path])
    loader = _Loader()
    early = _early(root, loader)
    assert early.begin(["serve", "--port", "9000"], "/srv", ENV) == 1
    with caplog.at_level(logging.INFO, logger="edge.engine"):
        ctx = early.context(early.open(path, 0), CFG)
    assert "default.gguf loaded early, beside the start's imports (the default model here)" in caplog.text
    assert early.handed_over == early.contexts_handed_over == 1 and ctx.thread == "edge-early-load"
    early.finish()


def test_names_resolve_per_directory_and_settings(tmp_path: Path) -> None:
    root, path = tmp_path / "starts", _model(tmp_path, "smollm2.gguf")
    _start(root, ["serve", "smollm2"], {"smollm2": path}, [path])
    for cwd, env in (("/elsewhere", ENV), ("/srv", {**ENV, "EDGE_MODELS_DIR": "/other"})):
        loader = _Loader()
        assert _early(root, loader).begin(["serve", "smollm2", "--port", "1"], cwd, env) == 0
        assert loader.calls == []


def test_a_name_whose_file_this_start_did_not_load_is_not_recorded(tmp_path: Path) -> None:
    """A load that failed (or a path the host spelled otherwise) leaves no guess behind."""
    root, a, b = tmp_path / "starts", _model(tmp_path, "a.gguf"), _model(tmp_path, "b.gguf")
    _start(root, ["serve", "a", "b"], {"a": a, "b": b}, [a])
    assert [w.path for w in read_record(root, name_key("a", "/srv", ENV))] == [a]
    assert read_record(root, name_key("b", "/srv", ENV)) == []


def test_the_default_model_is_guessed_only_where_no_model_may_be_named(tmp_path: Path) -> None:
    """`serve --port 9000` names none; `serve qwen` names one never served here: no guess, so no
    context made for the wrong model while the plan measures free memory."""
    root, path = tmp_path / "starts", _model(tmp_path, "default.gguf")
    _start(root, ["serve"], {None: path}, [path])
    for argv, guessed in ((["serve", "--port", "9000", "--slots=2"], 1), (["serve", "qwen"], 0),
                          (["serve", "--port", "9000", "qwen"], 0)):
        early = _early(root, _Loader())
        started = early.begin(argv, "/srv", ENV)
        early.finish()  # nobody asked: closed
        assert started == guessed, argv
