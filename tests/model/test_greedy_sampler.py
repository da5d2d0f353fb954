"""GreedySampler picks what llama.cpp's own logit-bias + greedy chain picks, on every row of
a real decode of each catalog model (their vocabularies: 49k, 152k, 262k tokens)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from edge.runtime.llama import llama_cpp
from edge.runtime.llama.batch import Batch
from edge.runtime.llama.model import ContextConfig, LlamaContext, LlamaModel
from edge.runtime.llama.sampling import (
    ChainSampler,
    GrammarFirstLast,
    GreedySampler,
    build_chain,
    build_sampler,
)
from edge.runtime.types import SamplingParams

TEXT = "Here is a long story about a lighthouse keeper who finds a map. It begins on a cold night, when"


@pytest.fixture(params=["smollm2_path", "qwen_coder_path", "gemma_path"])
def model(request: pytest.FixtureRequest) -> LlamaModel:
    path: Path = request.getfixturevalue(request.param)
    m = LlamaModel(path)
    yield m
    m.close()


def test_every_row_picks_what_the_chain_picks_with_and_without_biases(model: LlamaModel) -> None:
    ctx = LlamaContext(model, ContextConfig(n_ctx=256, n_batch=64, n_ubatch=64, n_seq_max=1, n_threads=2,
                                                n_outputs_max=64))
    toks = model.tokenize(TEXT)
    batch = Batch(len(toks))
    try:
        batch.add_tokens(0, toks, 0)  # logits on every row
        assert batch.decode(ctx.ptr) == 0
        llama_cpp.llama_synchronize(ctx.ptr)
        rng = random.Random(7)
        plain = ChainSampler(build_chain(SamplingParams(temperature=0.0), model.vocab, model.n_vocab))
        compared = banned_best = 0
        try:
            for row in range(len(toks)):
                best = plain.sample(ctx.ptr, row)
                bias = {best: -100.0, rng.randrange(model.n_vocab): 3.5, rng.randrange(model.n_vocab): -1e9}
                p = SamplingParams(temperature=0.0, logit_bias=bias)
                chain = ChainSampler(build_chain(p, model.vocab, model.n_vocab))
                fast = build_sampler(p, model.vocab, model.n_vocab)
                assert isinstance(fast, GreedySampler)
                try:
                    assert GreedySampler({}, model.n_vocab).sample(ctx.ptr, row) == best
                    got = fast.sample(ctx.ptr, row)
                    assert got == chain.sample(ctx.ptr, row) and got != best
                    banned_best += 1
                finally:
                    chain.free()
                    fast.free()
                compared += 1
        finally:
            plain.free()
        assert compared == len(toks) >= 15 and banned_best == compared
    finally:
        batch.free()
        ctx.close()


def test_a_grammar_or_penalties_keep_their_chains(smollm2_path: Path) -> None:
    m = LlamaModel(smollm2_path, vocab_only=True)
    try:
        yes_no = SamplingParams(temperature=0.0, grammar='root ::= "yes" | "no"')
        g = build_sampler(yes_no, m.vocab, m.n_vocab)
        pen = build_sampler(SamplingParams(temperature=0.0, repeat_penalty=1.3), m.vocab, m.n_vocab)
        try:
            assert isinstance(g, GrammarFirstLast) and isinstance(pen, ChainSampler)
        finally:
            g.free()
            pen.free()
    finally:
        m.close()
