"""GreedySampler (runtime/llama/sampling.py) chooses as llama.cpp's logit-bias + greedy chain
does: the highest biased logit, the lowest token id of equal ones, biases added in float32."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from edge.runtime.llama.sampling import ChainSampler, GreedySampler, build_sampler
from edge.runtime.types import SamplingParams


def _rows(*rows: list[float]) -> tuple[Any, list[tuple[int, int]]]:
    asked: list[tuple[int, int]] = []
    table = [np.array(r, dtype=np.float32) for r in rows]

    def row(ctx: Any, idx: int, n_vocab: int) -> np.ndarray:
        asked.append((idx, n_vocab))
        return table[idx]

    return row, asked


def test_the_highest_logit_of_the_row_asked_for() -> None:
    row, asked = _rows([0.1, 2.5, -1.0, 2.4], [3.0, 0.0, 0.0, 0.0])
    s = GreedySampler({}, 4, row)
    assert s.sample(None, 0) == 1 and s.sample(None, 1) == 0
    assert asked == [(0, 4), (1, 4)]


def test_of_equal_logits_the_lowest_token_id_as_llama_cpp_keeps_the_first() -> None:
    row, _ = _rows([1.0, 7.0, 7.0, 7.0])
    assert GreedySampler({}, 4, row).sample(None, 0) == 1
    row, _ = _rows([1.0, 2.0, 5.0, 3.0])  # a bias that makes a tie: still the lowest id
    assert GreedySampler({3: 2.0}, 4, row).sample(None, 0) == 2


def test_biases_ban_raise_and_leave_the_logits_llama_cpp_holds_untouched() -> None:
    logits = [0.0, 9.0, 8.0, 1.0]
    row, _ = _rows(logits)
    assert GreedySampler({1: -100.0}, 4, row).sample(None, 0) == 2  # the best one banned
    assert GreedySampler({1: -math.inf, 2: -math.inf}, 4, row).sample(None, 0) == 3
    assert GreedySampler({0: 9.5}, 4, row).sample(None, 0) == 0  # raised past the best
    assert row(None, 0, 4).tolist() == logits  # the scratch copy took the biases


def test_bias_sums_round_as_float32_like_llama_cpp() -> None:
    # 1e8 + 4 rounds back to 1e8 in float32 (spacing 8 there): a tie, which the lower id wins;
    # summed in float64 the biased token 1 would win
    assert np.float32(1e8) + np.float32(4.0) == np.float32(1e8)
    row, _ = _rows([1e8, 1e8])
    assert GreedySampler({1: 4.0}, 2, row).sample(None, 0) == 0


def test_biases_without_copying_the_row_choose_as_the_whole_biased_row() -> None:
    """The path that reads only the biased logits agrees with adding every bias to a copy of the
    row, on rows full of ties (small integer logits) and biases that ban, raise and tie."""
    rng = np.random.default_rng(7)
    copies = 0
    for _ in range(3000):
        n = int(rng.integers(2, 12))
        logits = rng.integers(-3, 4, size=n).astype(np.float32)
        ids = rng.choice(n, size=int(rng.integers(1, n + 1)), replace=False)
        bias = {int(i): float(rng.choice([-math.inf, -100.0, -1.0, 1.0, 2.0, 0.0])) for i in ids}
        expect = logits.copy()
        for i, b in bias.items():
            expect[i] = np.float32(expect[i] + np.float32(b))
        row, _ = _rows(logits.tolist())
        s = GreedySampler(bias, n, row)
        scratch_before = s._scratch.copy()
        assert s.sample(None, 0) == int(expect.argmax()), (logits, bias)
        copies += not np.array_equal(s._scratch, scratch_before)
    assert 0 < copies < 3000  # both paths ran: the copy only where the unbiased best is biased


@pytest.mark.parametrize("params, kind", [
    (SamplingParams(temperature=0.0), GreedySampler),
    (SamplingParams(temperature=0.0, logit_bias={5: -100.0}), GreedySampler),
    (SamplingParams(temperature=0.0, repeat_penalty=1.1), ChainSampler),  # penalties keep state
    (SamplingParams(temperature=0.7), ChainSampler),
])
def test_greedy_decoding_without_penalties_or_grammar_is_the_numpy_path(params: SamplingParams,
                                                                        kind: type) -> None:
    from edge.runtime.llama.loadlog import ensure_backend

    ensure_backend()
    sampler = build_sampler(params, None, 32)  # no grammar: no vocabulary needed
    try:
        assert type(sampler) is kind
    finally:
        sampler.free()


def test_greedy_decoding_samples_with_the_chain_until_numpy_is_imported(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A server imports numpy once its start is over (serve._after_start): a greedy request
    before that must not pay the import on its first token, so it gets the chain."""
    import sys

    from edge.runtime.llama.loadlog import ensure_backend

    ensure_backend()
    monkeypatch.delitem(sys.modules, "numpy")  # restored after the test
    sampler = build_sampler(SamplingParams(temperature=0.0), None, 32)
    try:
        assert type(sampler) is ChainSampler
    finally:
        sampler.free()
