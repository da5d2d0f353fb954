"""Tool calls in OpenAI's chat shapes. The parsing itself lives in `edge.toolcalls` (shared with
the CLI); its names are re-exported here for the API modules."""

from __future__ import annotations

from typing import Any

from edge.toolcalls import ArgsDelta, CallScanner, CallStart, ParsedCall, calls_in, new_call_id

__all__ = ["ArgsDelta", "CallScanner", "CallStart", "ParsedCall", "call_delta", "call_json", "calls_in",
           "new_call_id"]


def call_json(c: ParsedCall) -> dict[str, Any]:
    """A call in a chat.completion message."""
    return {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}


def call_delta(value: CallStart | ArgsDelta) -> dict[str, Any]:
    """How OpenAI streams a call: id, type and name with empty arguments first, then argument pieces."""
    if isinstance(value, CallStart):
        return {"tool_calls": [{"index": value.index, "id": value.id, "type": "function",
                                "function": {"name": value.name, "arguments": ""}}]}
    return {"tool_calls": [{"index": value.index, "function": {"arguments": value.text}}]}
