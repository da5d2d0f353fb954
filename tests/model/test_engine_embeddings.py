"""Embeddings on their own context over the loaded weights, one batch per engine step."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edge.errors import ContextOverflow, InvalidRequest
from edge.runtime.engine.config import EngineConfig
from edge.runtime.engine.core import Engine
from edge.runtime.types import GenerationRequest, SamplingParams

pytestmark = pytest.mark.model

SENTENCES = [
    "The cat sat on the mat and purred.",
    "A kitten was sitting on the rug, purring.",
    "Quarterly revenue grew by twelve percent in Asia.",
    "The stock market closed higher after the earnings report.",
]


def cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b))  # the vectors are L2-normalised


def test_similar_sentences_score_higher_and_a_batch_equals_one_by_one(smollm2_path: Path) -> None:
    with Engine(EngineConfig(smollm2_path, n_ctx=512, n_slots=2, n_threads=2)) as eng:
        info = eng.embedding_info()
        assert info["n_embd"] == 576 and info["pooling"] == "mean"  # a causal LM: mean-pooled
        batch = eng.embed(SENTENCES).future.result(timeout=60)
        assert len(batch) == 4 and all(v.shape == (576,) for v in batch)
        assert all(abs(float(np.linalg.norm(v)) - 1.0) < 1e-5 for v in batch)
        assert cos(batch[0], batch[1]) > cos(batch[0], batch[2])
        assert cos(batch[2], batch[3]) > cos(batch[1], batch[3])
        one_by_one = [eng.embed([s]).future.result(timeout=60)[0] for s in SENTENCES]
        for a, b in zip(batch, one_by_one, strict=True):
            assert cos(a, b) > 0.9999 and float(np.abs(a - b).max()) < 1e-3
        ids = eng.tokenize(SENTENCES[0])
        assert cos(eng.embed([ids]).future.result(timeout=60)[0], batch[0]) > 0.9999  # token ids in
        stats = eng.stats()
        assert stats.embed_inputs == 9 and stats.embed_batches >= 6


def test_bad_inputs_fail_before_anything_is_queued(smollm2_path: Path) -> None:
    with Engine(EngineConfig(smollm2_path, n_ctx=512, n_slots=2, n_threads=2)) as eng:
        with pytest.raises(InvalidRequest):
            eng.embed([])
        with pytest.raises(InvalidRequest):
            eng.embed([[10**9]])
        with pytest.raises(ContextOverflow) as exc:
            eng.embed(["word " * 5000])
        assert exc.value.n_ctx == 2048
        with pytest.raises(InvalidRequest):
            eng.embed(["x"] * 2049)


def test_an_embedding_burst_delays_chat_one_batch_per_step(smollm2_path: Path) -> None:
    with Engine(EngineConfig(smollm2_path, n_ctx=512, n_slots=2, n_threads=2)) as eng:
        eng.embed(["warm up"]).future.result(timeout=60)
        before = eng.stats()
        burst = [eng.embed([f"document {i}: " + "text " * 60] * 8) for i in range(4)]  # 32 x ~60 tokens
        chat = eng.submit(GenerationRequest("Count: one, two, three,", max_tokens=12,
                                            sampling=SamplingParams(temperature=0.0)))
        out = chat.text()
        during = eng.stats()
        for f in burst:
            assert len(f.future.result(timeout=600)) == 8
        done = eng.stats()
        chat_steps = during.total_steps - before.total_steps
        batches = during.embed_batches - before.embed_batches
        assert out and chat_steps >= 11 and during.chat_steps_with_embed >= 1  # prompt step + 11 decodes
        # every chat step waited for at most one embedding batch (the chat did not wait for the burst)
        assert 1 <= batches <= chat_steps + 1
        # and they take at most half the engine's time beside chat: most chat steps ran alone
        assert during.chat_steps_with_embed - before.chat_steps_with_embed <= chat_steps // 2 + 1
        assert done.embed_inputs - before.embed_inputs == 32
