"""One source per rule: the CLI, settings, engine defaults and both HTTP schemas take their enums,
defaults and bounds from `edge.contracts.options`, and errors carry `retry_after_s` / `param`."""

from __future__ import annotations

import argparse
import ast
import math
from pathlib import Path
from typing import Any, get_args

import pytest

from edge.api.errors import to_http
from edge.api.ollama_schemas import ChatRequest, Options
from edge.api.schemas import ChatCompletionRequest, CompletionRequest, parse_body, parse_model
from edge.cli import build_parser
from edge.config import Settings
from edge.contracts import options as opt
from edge.errors import (
    ConfigError,
    EdgeError,
    InvalidRequest,
    ModelLoadError,
    PreviousResponseNotFound,
    QueueFull,
)
from edge.runtime.llama.model import ContextConfig
from edge.runtime.llama.sampling import validate_sampling
from edge.runtime.step import plan
from edge.runtime.types import MAX_TOP_LOGPROBS, SamplingParams

MSG = [{"role": "user", "content": "hi"}]


def _subcommand(name: str) -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def _choices(parser: argparse.ArgumentParser, dest: str) -> tuple[Any, ...]:
    return tuple(next(a for a in parser._actions if a.dest == dest).choices)


def test_the_contract_module_is_a_leaf() -> None:
    tree = ast.parse(Path(opt.__file__).read_text())
    imported = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [m for m in imported if m and m.split(".")[0] == "edge"]


def test_cli_choices_are_the_contract_tuples() -> None:
    serve = _subcommand("serve")
    assert _choices(serve, "speculative") == opt.SPECULATIVE_MODES == ("off", "ngram", "draft")
    assert _choices(serve, "flash_attn") == opt.FLASH_ATTN_KINDS == ("auto", "on", "off", "fastest")
    # the simulator models no draft model: every other mode
    sim_modes = tuple(m for m in opt.SPECULATIVE_MODES if m != "draft")
    assert _choices(_subcommand("sim"), "speculative") == sim_modes


def test_settings_fields_are_the_contract_types_and_defaults() -> None:
    fields = Settings.model_fields
    assert get_args(fields["speculative"].annotation) == opt.SPECULATIVE_MODES
    assert get_args(fields["flash_attn"].annotation) == opt.FLASH_ATTN_KINDS
    defaults = {name: fields[name].default for name in
                ("speculative", "flash_attn", "n_batch", "slots", "draft_max", "prompt_cache_mib")}
    assert defaults == {"speculative": opt.DEFAULT_SPECULATIVE, "flash_attn": opt.DEFAULT_FLASH_ATTN,
                        "n_batch": opt.DEFAULT_N_BATCH, "slots": opt.DEFAULT_SLOTS,
                        "draft_max": opt.DEFAULT_DRAFT_MAX, "prompt_cache_mib": opt.DEFAULT_PROMPT_CACHE_MIB}
    Settings(draft_max=opt.DRAFT_MAX_LIMIT)
    with pytest.raises(Exception, match="draft_max"):
        Settings(draft_max=opt.DRAFT_MAX_LIMIT + 1)


def test_runtime_defaults_are_the_contract_values() -> None:
    cfg = ContextConfig(n_ctx=64)
    assert (cfg.n_batch, cfg.n_ubatch, cfg.n_seq_max) == (opt.DEFAULT_N_BATCH, opt.DEFAULT_N_BATCH,
                                                          opt.DEFAULT_SLOTS)
    assert (plan.N_BATCH, plan.STEP_TOKEN_BUDGET) == (opt.DEFAULT_N_BATCH, opt.STEP_TOKEN_BUDGET)
    assert MAX_TOP_LOGPROBS is opt.MAX_TOP_LOGPROBS


# (field, largest accepted, smallest refused above it, smallest accepted, largest refused below it)
BOUNDS = [
    ("temperature", opt.TEMPERATURE_MAX, opt.TEMPERATURE_MAX + 0.01, 0.0, -0.01),
    ("repeat_penalty", opt.REPEAT_PENALTY_MAX, opt.REPEAT_PENALTY_MAX + 0.01, 0.01, 0.0),
    ("presence_penalty", opt.PENALTY_ABS_MAX, opt.PENALTY_ABS_MAX + 0.01, -opt.PENALTY_ABS_MAX,
     -opt.PENALTY_ABS_MAX - 0.01),
    ("frequency_penalty", opt.PENALTY_ABS_MAX, opt.PENALTY_ABS_MAX + 0.01, -opt.PENALTY_ABS_MAX,
     -opt.PENALTY_ABS_MAX - 0.01),
]


def _openai(field: str, value: float) -> None:
    parse_body(ChatCompletionRequest, {"model": "m", "messages": MSG, field: value})


def _ollama(field: str, value: float) -> None:
    parse_model(Options, {field: value})


def _engine(field: str, value: float) -> None:
    validate_sampling(SamplingParams(**{field: value}), n_vocab=100)


@pytest.mark.parametrize("check", [_openai, _ollama, _engine])
@pytest.mark.parametrize(("field", "hi_ok", "hi_bad", "lo_ok", "lo_bad"), BOUNDS)
def test_every_entry_point_takes_the_same_sampling_bounds(
    check: Any, field: str, hi_ok: float, hi_bad: float, lo_ok: float, lo_bad: float
) -> None:
    check(field, hi_ok)
    check(field, lo_ok)
    for bad in (hi_bad, lo_bad, math.inf):
        with pytest.raises(InvalidRequest) as err:
            check(field, bad)
        assert err.value.param is not None and err.value.param.endswith(field)


def test_top_logprobs_bound_is_max_top_logprobs_everywhere() -> None:
    n = opt.MAX_TOP_LOGPROBS
    chat = {"model": "m", "messages": MSG, "logprobs": True}
    assert parse_body(ChatCompletionRequest, {**chat, "top_logprobs": n}).logprobs_n() == n
    assert parse_body(CompletionRequest, {"model": "m", "prompt": "x", "logprobs": n}).logprobs_n() == n
    parse_model(ChatRequest, {"model": "m", "messages": MSG, "top_logprobs": n})
    too_many = (
        (ChatCompletionRequest, {**chat, "top_logprobs": n + 1}, "top_logprobs"),
        (CompletionRequest, {"model": "m", "prompt": "x", "logprobs": n + 1}, "logprobs"),
        (ChatRequest, {"model": "m", "messages": MSG, "top_logprobs": n + 1}, "top_logprobs"),
    )
    for cls, body, param in too_many:
        with pytest.raises(InvalidRequest) as err:
            parse_model(cls, body)
        assert err.value.param == param


def test_errors_declare_param_and_retry_after_on_the_base() -> None:
    assert EdgeError.param is None and EdgeError.retry_after_s is None
    assert ConfigError("n_ctx", "too big").param == "n_ctx"
    assert PreviousResponseNotFound("resp_1").param == "previous_response_id"
    assert ModelLoadError("m.gguf", "no").retry_after_s is None
    status, body, _ = to_http(ConfigError("n_ctx", "too big"))
    assert status == 400 and body["error"]["param"] == "n_ctx"
    assert to_http(QueueFull(3, retry_after_s=2.5))[2]["Retry-After"] == "3"
    assert to_http(ModelLoadError("m.gguf", "no"))[2]["Retry-After"] == "1"  # 503 without its own: 1 s
