"""Perplexity arithmetic without a model: windows, chunks, log-softmax, vocabulary checks."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np
import pytest

from edge.errors import InvalidRequest
from edge.tools.perplexity import (
    Window,
    chunk_window,
    logits_rows,
    perplexity,
    plan_for_text,
    plan_windows,
    relative_change_pct,
    token_nll,
    vocab_difference,
)


def _scored(windows: list[Window]) -> list[int]:
    return [j for w in windows for j in range(w.score_from, w.end)]


def _hf_scored(n: int, max_length: int, stride: int) -> list[int]:
    """The loop of Hugging Face's "perplexity of fixed-length models" guide, as the positions it
    scores: labels outside the last trg_len are -100, and the model's label shift drops each
    window's first position."""
    out: list[int] = []
    prev_end = 0
    for begin in range(0, n, stride):
        end = min(begin + max_length, n)
        trg_len = end - prev_end
        out += [j for j in range(end - trg_len, end) if j > begin]
        prev_end = end
        if end == n:
            break
    return out


def test_windows_by_hand() -> None:
    assert plan_windows(10, 4, 2) == [Window(0, 4, 1), Window(2, 6, 4), Window(4, 8, 6), Window(6, 10, 8)]
    # the last window ends at the text's end even when the stride does not divide the rest
    assert plan_windows(9, 4, 3) == [Window(0, 4, 1), Window(3, 7, 4), Window(6, 9, 7)]
    assert plan_windows(4, 4, 2) == [Window(0, 4, 1)]  # exactly one window
    # with BOS in front of every window the first text token is scored and windows may abut
    assert plan_windows(10, 4, 4, bos_prefix=True) == [Window(0, 4, 0), Window(4, 8, 4), Window(8, 10, 8)]


@pytest.mark.parametrize("bos", [False, True])
def test_every_token_scored_once_with_enough_context(bos: bool) -> None:
    lead = 0 if bos else 1
    for n, window in itertools.product(range(2, 40), range(2, 12)):
        for stride in range(1, window - lead + 1):
            if n < window:
                continue
            ws = plan_windows(n, window, stride, bos_prefix=bos)
            assert sorted(_scored(ws)) == list(range(lead, n)) == _scored(ws), (n, window, stride)
            for k, w in enumerate(ws):
                assert w.end - w.begin <= window and w.score_from >= w.begin + lead
                if k:  # after the first window every scored token sees >= window - stride tokens
                    assert w.score_from - w.begin >= window - stride
            if not bos:
                assert _scored(ws) == _hf_scored(n, window, stride), (n, window, stride)


@pytest.mark.parametrize(("n", "window", "stride", "bos"), [
    (3, 4, 2, False),  # text shorter than a window
    (10, 4, 4, False),  # no overlap: each window's first token would go unscored
    (10, 4, 0, True),
    (10, 0, 1, True),
])
def test_bad_window_arguments(n: int, window: int, stride: int, bos: bool) -> None:
    with pytest.raises(ValueError):
        plan_windows(n, window, stride, bos_prefix=bos)


def test_plan_for_text_names_the_sizes() -> None:
    with pytest.raises(InvalidRequest) as err:
        plan_for_text(100, 256, 128, bos_prefix=False)
    assert err.value.param == "text"
    assert "100 tokens" in str(err.value) and "256" in str(err.value) and "--ctx 256" in str(err.value)
    with pytest.raises(InvalidRequest) as err:
        plan_for_text(100, 256, 128, bos_prefix=True)
    assert "needs 255 plus BOS" in str(err.value)
    with pytest.raises(InvalidRequest) as err:
        plan_for_text(1000, 256, 256, bos_prefix=False)
    assert err.value.param == "stride" and "between 1 and 255" in str(err.value)
    assert len(plan_for_text(1000, 256, 255, bos_prefix=True)) == 4  # 255-token windows abut


def test_nll_by_hand() -> None:
    logits = np.array([
        [0.0, 0.0, 0.0, 0.0],  # uniform over 4: -log(1/4)
        [0.0, math.log(2.0), math.log(5.0), -math.inf],  # softmax 1/8, 2/8, 5/8, 0
        [0.0, math.log(2.0), math.log(5.0), -math.inf],
    ], dtype=np.float32)
    nll = token_nll(logits, [2, 1, 2])
    assert nll.dtype == np.float64
    np.testing.assert_allclose(nll, [math.log(4), math.log(4), math.log(8 / 5)], rtol=1e-6)
    assert perplexity(float(nll.sum()), 3) == pytest.approx(math.exp((2 * math.log(4) + math.log(1.6)) / 3))


def test_nll_is_stable_for_large_logits() -> None:
    big = np.array([[1000.0, 1000.0, -1000.0]], dtype=np.float32)  # exp() would overflow unshifted
    np.testing.assert_allclose(token_nll(big, [0]), [math.log(2)], rtol=1e-12)
    # float64 accumulation: a 49k-way near-uniform row keeps its digits
    row = np.zeros((1, 49152), dtype=np.float32)
    assert token_nll(row, [7])[0] == pytest.approx(math.log(49152), rel=1e-12)


def test_chunks_cover_the_window_within_both_limits() -> None:
    for length, n_batch, n_rows in itertools.product((2, 17, 256, 511, 512, 700), (16, 64, 512), (16, 170)):
        for out_from in {0, 1, length // 2, length - 2}:
            chunks = chunk_window(length, out_from, n_batch, n_rows)
            assert chunks[0][0] == 0 and chunks[-1][1] == length
            assert all(a[1] == b[0] for a, b in itertools.pairwise(chunks))
            for c0, c1 in chunks:
                assert 0 < c1 - c0 <= n_batch
                assert max(0, min(c1, length - 1) - max(c0, out_from)) <= n_rows


def test_logits_rows_follow_the_vocabulary() -> None:
    assert logits_rows(49152) == 170  # SmolLM2: 32 MiB of float32 rows
    assert logits_rows(262144) == 32  # Gemma 3
    assert logits_rows(64) == 512  # tiny vocabularies are capped by the batch
    assert logits_rows(10_000_000) == 16


def test_relative_change() -> None:
    assert relative_change_pct(20.0, 21.0) == pytest.approx(5.0)
    assert relative_change_pct(20.0, 19.0) == pytest.approx(-5.0)


@dataclass
class FakeVocab:
    n_vocab: int = 100
    add_bos: bool = False
    renamed: dict[int, bytes] = field(default_factory=dict)
    split: bool = False

    def piece(self, token: int, special: bool = False) -> bytes:
        return self.renamed.get(token, f"<{token}>".encode())

    def tokenize(self, text: str, add_bos: bool = True, parse_special: bool = True) -> list[int]:
        words = list(text) if self.split else text.split()
        return [hash(w) % self.n_vocab for w in words]


def test_vocab_difference() -> None:
    text = "the same words in both"
    assert vocab_difference(FakeVocab(), FakeVocab(), text) is None
    assert "sizes differ (100 vs 101" in str(vocab_difference(FakeVocab(), FakeVocab(n_vocab=101), text))
    assert "adds BOS" in str(vocab_difference(FakeVocab(), FakeVocab(add_bos=True), text))
    why = vocab_difference(FakeVocab(), FakeVocab(renamed={50: b"x"}), text)
    assert why is not None and "token 50" in why
    why = vocab_difference(FakeVocab(), FakeVocab(split=True), text)
    assert why is not None and "tokenizes differently" in why
