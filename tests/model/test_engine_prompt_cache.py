"""Idle prompt caches moved to host memory and restored, on the real SmolLM2: the restored cells
are the document (the answer needs them), the KV cache holds only what runs, and nothing is
evaluated twice."""

from __future__ import annotations

from pathlib import Path

import pytest

from edge.runtime import Engine, EngineConfig

pytestmark = pytest.mark.model

WORDS = "apple, river, candle, falcon, meadow, lantern, pebble, orchard"
DOC_A = (f"Remember this list of code words: {WORDS}. The list is important and will be asked "
         "for again later, so keep it in mind while reading the rest of this note. " * 3)
DOC_B = "The weather report says it will rain on Tuesday and be sunny on Thursday. " * 4


def _ask(doc: str) -> str:
    return f"<|im_start|>user\n{doc}<|im_end|>\n<|im_start|>assistant\nThe code words are: apple, river,"


def test_a_document_comes_back_from_host_memory(smollm2_path: Path) -> None:
    with Engine(EngineConfig(smollm2_path, n_ctx=2048, n_slots=2, n_threads=2, speculative="off")) as eng:
        first = eng.complete(_ask(DOC_A), max_tokens=12, temperature=0.0, add_bos=False)
        assert "candle, falcon" in first.text
        b = eng.complete(_ask(DOC_B), max_tokens=12, temperature=0.0, add_bos=False)
        st = eng.stats()
        assert st.prompt_cache_entries == 1 and st.prompt_cache_bytes > 0
        ctx = eng.residency.ctx
        assert ctx is not None
        # the KV cache holds the second document's sequence only: the first one's cells went
        held = sorted(ctx.seq_pos_max(s) + 1 for s in range(2))
        assert held[0] == 0 and held[1] <= b.usage.prompt_tokens + b.usage.completion_tokens
        again = eng.complete(_ask(DOC_A), max_tokens=12, temperature=0.0, add_bos=False)
        assert again.usage.cached_tokens == again.usage.prompt_tokens - 1  # restored: one token evaluated
        assert "candle, falcon" in again.text  # the restored cells are the list (not in the prompt's tail)
        assert eng.stats().prompt_cache_restored == 1
        held = sorted(ctx.seq_pos_max(s) + 1 for s in range(2))
        assert held[0] == 0 and held[1] >= again.usage.prompt_tokens  # the second document moved out


def test_without_host_memory_the_cache_stays_in_its_slot(smollm2_path: Path) -> None:
    with Engine(EngineConfig(smollm2_path, n_ctx=2048, n_slots=2, n_threads=2, speculative="off",
                             prompt_cache_bytes=0)) as eng:
        eng.complete(_ask(DOC_A), max_tokens=12, temperature=0.0, add_bos=False)
        eng.complete(_ask(DOC_B), max_tokens=12, temperature=0.0, add_bos=False)
        assert eng.stats().prompt_cache_entries == 0
        again = eng.complete(_ask(DOC_A), max_tokens=12, temperature=0.0, add_bos=False)
        assert again.usage.cached_tokens == again.usage.prompt_tokens - 1  # its slot kept it
        assert "candle, falcon" in again.text and eng.stats().prompt_cache_restored == 0
