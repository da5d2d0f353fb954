"""`--tools FILE.json` for `edge run` and `edge chat`: load OpenAI tool definitions, parse the
calls the model makes (`edge.toolcalls`, the parser the HTTP API uses) and print them as they
decode: `[tool call] NAME ARGUMENTS` on a line of its own, the arguments streaming in."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, TextIO

from edge.errors import InvalidRequest
from edge.runtime.types import EngineLike
from edge.toolcalls import CallScanner, ParsedCall, template_arguments

_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")  # OpenAI's rule for function names


def load_tools(path: Path) -> list[dict[str, Any]]:
    """A JSON list of OpenAI tools (`{"type": "function", "function": {name, description,
    parameters}}`; the flat Responses shape and `{"tools": [...]}` are read too), in the chat shape."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InvalidRequest(f"--tools {path}: {exc}", "--tools") from None
    if isinstance(data, dict) and isinstance(data.get("tools"), list):
        data = data["tools"]
    if not isinstance(data, list) or not data:
        raise InvalidRequest(f"--tools {path}: expected a non-empty JSON list of tools", "--tools")
    tools = []
    for i, tool in enumerate(data):
        fn = tool.get("function", tool) if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or tool.get("type", "function") != "function":
            raise InvalidRequest(f"--tools {path}: tool {i} is not a function tool", "--tools")
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise InvalidRequest(f"--tools {path}: tool {i} needs a name of 1-64 letters, digits, _ . -",
                                 "--tools")
        params = fn.get("parameters", {"type": "object"})
        if not isinstance(params, dict):
            raise InvalidRequest(f"--tools {path}: tool {i} ({name}): parameters must be a JSON schema",
                                 "--tools")
        entry: dict[str, Any] = {"name": name, "parameters": params}
        if isinstance(fn.get("description"), str):
            entry["description"] = fn["description"]
        tools.append({"type": "function", "function": entry})
    return tools


def scanner_for(engine: EngineLike, tools: list[dict[str, Any]]) -> CallScanner:
    """The call parser for the model's own tool syntax; a template without tools is an error."""
    info = engine.chat_template_info
    if info is None or not info.tools:
        raise InvalidRequest("this model's chat template cannot show tools; try --chat-template chatml-tools",
                             "--tools")
    return CallScanner(info.tool_format or "generic", frozenset(t["function"]["name"] for t in tools),
                       stream_calls=True)


def print_events(events: list[tuple[str, Any]], out: TextIO) -> None:
    """Content as it comes; a call as `[tool call] NAME ` then its arguments, then a newline."""
    for kind, value in events:
        if kind == "content":
            out.write(value)
        elif kind == "call_start":
            out.write(f"\n[tool call] {value.name} ")
        elif kind == "call_args":
            out.write(value.text)
        else:
            out.write("\n")
        out.flush()


def assistant_turn(content: str, calls: list[ParsedCall]) -> dict[str, Any]:
    """The assistant's message with its calls, as chat templates expect it in the history."""
    return {"role": "assistant", "content": content,
            "tool_calls": [{"id": c.id, "type": "function",
                            "function": {"name": c.name, "arguments": template_arguments(c.arguments)}}
                           for c in calls]}
