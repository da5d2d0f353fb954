"""The KV cache element types edge offers: one table for settings, planner, CLI, inspect and loader.

Byte sizes come from `edge.gguf.info.KV_TYPE_BLOCKS` (ggml's own block table);
the llama.cpp enum value is looked up by name in `edge/runtime/llama/model.py`.
"""

from __future__ import annotations

from typing import Literal, get_args

KVType = Literal["f16", "q8_0", "q4_0"]
KV_CACHE_TYPES: tuple[str, ...] = get_args(KVType)


def kv_type_problem(value: str) -> str | None:
    """Why `value` is not a KV cache type, else None."""
    if value in KV_CACHE_TYPES:
        return None
    return f"{value!r} is not one of {', '.join(KV_CACHE_TYPES)}"


def per_sequence_streams(n_swa: int) -> bool:
    """Whether the KV cache gives each sequence its own stream (llama.cpp's kv_unified = false)
    rather than one pool of cells all sequences share.

    A unified cache computes every sequence's attention over every cell in use, other
    sequences' included (masked, but still multiplied): four streams of 216 tokens each attend
    over ~860 cells, and a fresh prompt lands after the idle slots' caches. Sliding-window
    models (Gemma 3: 4 query heads of 256, its attention the larger part of a step) lost 11 %
    of four-stream decode and 27 % of a long prompt's first token to that beside llama-server,
    whose default is a stream per sequence. Without a sliding window the unified pool stays:
    its cells can be shared between sequences (a common prefix, host-memory restores), which a
    stream per sequence cannot do without copying.
    """
    return n_swa > 0
