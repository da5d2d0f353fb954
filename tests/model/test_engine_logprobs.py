"""Log probabilities from the logits the engine already has: right, complete, and off unless asked."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from edge.errors import InvalidRequest
from edge.runtime.engine.config import EngineConfig
from edge.runtime.engine.core import Engine
from edge.runtime.types import GenerationRequest, SamplingParams

pytestmark = pytest.mark.model
PROMPT = "The capital of France is"


def test_greedy_tokens_are_the_most_likely_and_alternatives_are_ordered(smollm2_path: Path) -> None:
    with Engine(EngineConfig(smollm2_path, n_ctx=512, n_slots=2, n_threads=2)) as eng:
        out = eng.complete(PROMPT, max_tokens=8, temperature=0.0, logprobs=3)
        assert len(out.logprobs) == out.usage.completion_tokens == 8
        assert "".join(t.token for t in out.logprobs) == out.text
        for t in out.logprobs:
            assert t.logprob <= 0.0 and len(t.top) == 3
            assert t.top[0][2] == pytest.approx(t.logprob)  # greedy: the chosen token is the best
            assert t.top[0][0] == t.token and t.top[0][1] == t.bytes
            assert [v for *_, v in t.top] == sorted((v for *_, v in t.top), reverse=True)
            assert sum(math.exp(v) for *_, v in t.top) <= 1.0 + 1e-9
        only = eng.complete(PROMPT, max_tokens=4, temperature=0.0, logprobs=0)  # its own, no alternatives
        assert [t.logprob for t in only.logprobs] == pytest.approx([t.logprob for t in out.logprobs[:4]])
        assert all(t.top == () for t in only.logprobs)
        plain = eng.complete(PROMPT, max_tokens=4, temperature=0.0)
        assert plain.logprobs == () and plain.text == out.text[: len(plain.text)]


def test_sampled_tokens_carry_their_own_logprob_in_every_event(smollm2_path: Path) -> None:
    with Engine(EngineConfig(smollm2_path, n_ctx=512, n_slots=2, n_threads=2)) as eng:
        h = eng.submit(GenerationRequest(PROMPT, max_tokens=12, logprobs=2,
                                         sampling=SamplingParams(temperature=1.0, seed=5)))
        events = list(h)
        n = sum(len(e.logprobs) for e in events)
        assert n == events[-1].usage.completion_tokens  # every token, once (held-back text included)
        assert all(e.logprobs or not e.n_tokens for e in events[:-1])
        with pytest.raises(InvalidRequest):
            eng.submit(GenerationRequest(PROMPT, logprobs=21))
