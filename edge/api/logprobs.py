"""OpenAI's two shapes of log probabilities, from the engine's `TokenLogprob`s.

Chat: `{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}], "refusal": null}`.
Completions (legacy): `{"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from edge.runtime.types import TokenLogprob


def _entry(token: str, raw: bytes, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "bytes": list(raw)}


def chat_logprobs(items: Sequence[TokenLogprob]) -> dict[str, Any]:
    return {
        "content": [{**_entry(t.token, t.bytes, t.logprob),
                     "top_logprobs": [_entry(s, b, v) for s, b, v in t.top]} for t in items],
        "refusal": None,
    }


def completion_logprobs(items: Sequence[TokenLogprob], offset: int = 0) -> dict[str, Any]:
    """`offset`: characters of this choice's text before these tokens (streaming continues it)."""
    offsets = []
    for t in items:
        offsets.append(offset)
        offset += len(t.token)
    return {
        "tokens": [t.token for t in items],
        "token_logprobs": [t.logprob for t in items],
        "top_logprobs": [{s: v for s, _b, v in t.top} for t in items],
        "text_offset": offsets,
    }
