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
