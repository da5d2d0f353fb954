"""Ollama request parsing: keep_alive durations, options → sampling and lengths, refused fields."""

from __future__ import annotations

import logging

import pytest

from edge.api.ollama_schemas import ChatRequest, GenerateRequest, Options, parse_keep_alive
from edge.api.ollama_support import max_tokens_of, sampling_of
from edge.api.schemas import parse_model
from edge.errors import InvalidRequest
from edge.runtime.types import SamplingParams
from tests.fakes import make_app


@pytest.mark.parametrize(("value", "seconds"), [
    ("5m", 300.0), ("1h30m", 5400.0), ("300ms", 0.3), ("1.5h", 5400.0), ("2h45m30s", 9930.0),
    ("10s", 10.0), ("0", 0.0), ("0s", 0.0), (0, 0.0), (30, 30.0), (2.5, 2.5), ("45", 45.0),
    ("1m0.5s", 60.5), ("100us", 1e-4), ("+1m", 60.0),
])
def test_keep_alive_durations(value: str | float, seconds: float) -> None:
    assert parse_keep_alive(value) == pytest.approx(seconds)


@pytest.mark.parametrize("value", [-1, -0.5, "-1m", "-5m30s", "-1s"])
def test_negative_keep_alive_means_forever(value: str | float) -> None:
    assert parse_keep_alive(value) is None


@pytest.mark.parametrize("value", ["", "5x", "m", "1h 30m", "five minutes", "1.2.3s", "s5", "--1m", "-"])
def test_bad_keep_alive_is_refused(value: str) -> None:
    with pytest.raises(InvalidRequest) as exc:
        parse_keep_alive(value)
    assert exc.value.param == "keep_alive"


def test_non_finite_and_boolean_keep_alive_are_refused() -> None:
    for value in (float("inf"), float("nan")):
        with pytest.raises(InvalidRequest):
            parse_keep_alive(value)
    with pytest.raises(InvalidRequest):
        parse_model(ChatRequest, {"model": "m", "keep_alive": True})


def test_options_map_to_sampling_params() -> None:
    opts = Options(temperature=0.2, top_p=0.5, top_k=7, min_p=0.1, seed=42, repeat_penalty=1.3,
                   repeat_last_n=32, presence_penalty=0.5, frequency_penalty=-0.5)
    p = sampling_of(opts, grammar="root ::= \"x\"")
    assert (p.temperature, p.top_p, p.top_k, p.min_p, p.seed) == (0.2, 0.5, 7, 0.1, 42)
    penalties = (p.repeat_penalty, p.repeat_last_n, p.presence_penalty, p.frequency_penalty)
    assert penalties == (1.3, 32, 0.5, -0.5)
    assert p.grammar == "root ::= \"x\""
    assert sampling_of(Options(), None) == SamplingParams()  # nothing given: the engine's defaults
    assert sampling_of(Options(seed=-1), None).seed is None  # Ollama: negative seed = random


def test_num_predict_mapping() -> None:
    app, _ = make_app(max_tokens_cap=100)
    st = app.state.edge
    assert max_tokens_of(st, Options()) is None
    assert max_tokens_of(st, Options(num_predict=-1)) is None  # no limit: up to the context
    assert max_tokens_of(st, Options(num_predict=-2)) is None  # fill the context
    assert max_tokens_of(st, Options(num_predict=12)) == 12
    assert max_tokens_of(st, Options(num_predict=5000)) == 100  # the server's cap
    with pytest.raises(InvalidRequest):
        max_tokens_of(st, Options(num_predict=0))


def test_unknown_options_are_ignored_and_logged_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    opts = Options.model_validate({"temperature": 0.1, "num_thread": 4, "mirostat": 2, "wibble": 1})
    with caplog.at_level(logging.DEBUG, logger="edge.api"):
        opts.log_ignored()
    assert "mirostat" in caplog.text and "num_thread" in caplog.text
    assert "unknown: wibble" in caplog.text
    assert sampling_of(opts, None).temperature == 0.1


def test_bad_options_name_the_field() -> None:
    for bad, param in (({"temperature": -1}, "options.temperature"), ({"top_k": "x"}, "options.top_k"),
                       ({"num_ctx": 0}, "options.num_ctx"), ({"stop": [1]}, "options.stop[0]"),
                       ({"top_p": 0}, "options.top_p")):
        with pytest.raises(InvalidRequest) as exc:
            parse_model(GenerateRequest, {"model": "m", "options": bad})
        assert exc.value.param == param, exc.value


def test_model_or_legacy_name_is_required() -> None:
    assert parse_model(ChatRequest, {"name": "x"}).model == "x"
    with pytest.raises(InvalidRequest):
        parse_model(ChatRequest, {"messages": []})


def test_unknown_top_level_fields_are_ignored_as_ollama_does() -> None:
    body = parse_model(GenerateRequest, {"model": "m", "prompt": "p", "shift": True, "truncate": False})
    assert body.prompt == "p"
