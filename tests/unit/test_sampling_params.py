"""Sampling parameters are validated before a request is queued."""

from __future__ import annotations

import math

import pytest

from edge.errors import InvalidRequest
from edge.runtime.engine.facade import build_request
from edge.runtime.llama.sampling import json_schema_to_grammar, validate_sampling
from edge.runtime.types import Priority, SamplingParams

N_VOCAB = 1000


def test_defaults_are_valid() -> None:
    validate_sampling(SamplingParams(), N_VOCAB)
    validate_sampling(SamplingParams(temperature=0.0, top_k=0, top_p=1.0, min_p=0.0), N_VOCAB)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", -0.1),
        ("temperature", math.nan),
        ("top_k", -1),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("min_p", -0.01),
        ("repeat_penalty", 0.0),
        ("repeat_last_n", -2),
        ("frequency_penalty", 2.5),
        ("presence_penalty", math.inf),
        ("seed", -1),
        ("grammar", "   "),
    ],
)
def test_out_of_range_values_name_the_parameter(field: str, value: object) -> None:
    with pytest.raises(InvalidRequest) as err:
        validate_sampling(SamplingParams(**{field: value}), N_VOCAB)
    assert err.value.param == field


def test_logit_bias_token_ids_must_exist() -> None:
    validate_sampling(SamplingParams(logit_bias={0: -math.inf, 999: 5.0}), N_VOCAB)
    for bad in ({1000: 1.0}, {-1: 1.0}, {5: math.nan}, {5: math.inf}):
        with pytest.raises(InvalidRequest) as err:
            validate_sampling(SamplingParams(logit_bias=bad), N_VOCAB)
        assert err.value.param == "logit_bias"


def test_json_schema_to_grammar() -> None:
    gbnf = json_schema_to_grammar({"type": "object", "properties": {"n": {"type": "integer"}}})
    assert "root" in gbnf and '\\"n\\"' in gbnf
    assert "root" in json_schema_to_grammar(None)


def test_build_request_maps_flat_keywords() -> None:
    req = build_request("hi", temperature=0.0, max_tokens=3, stop="x", priority=Priority.BACKGROUND)
    assert req.sampling.temperature == 0.0 and req.max_tokens == 3 and req.stop == ("x",)
    with pytest.raises(InvalidRequest, match="unknown parameter"):
        build_request("hi", temprature=0.5)
