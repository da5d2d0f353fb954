"""What a JSON prefix already says about the tool calls in it, so a call can stream as it decodes.

`live_calls(text)` reads the (possibly unfinished) text of a call block: optional fence line,
optional top-level array, then call objects. For each object it reports the function name once
its string is complete and where the `arguments` (or llama3's `parameters`) value starts and,
once complete, ends. Only the top level of each object is looked at; other shapes
(`{"function": {...}}`, `{"tool_call": {...}}`) report no name and are parsed whole at the end.
Linear, no recursion; it never raises on malformed input (it just learns less).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

ARGUMENT_KEYS = frozenset({"arguments", "parameters"})


@dataclass
class LiveCall:
    name: str | None = None
    args_start: int | None = None  # index of the value's first character
    args_end: int | None = None  # index just past it, once complete
    args_object: bool = False  # the value is a JSON object (so its raw text streams as is)
    closed: bool = False  # the call object itself is complete
    end: int | None = None  # index just past the object's closing brace


def _string(literal: str) -> str | None:
    try:
        value = json.loads(literal)
    except ValueError:
        return None
    return value if isinstance(value, str) else None


def live_calls(text: str) -> list[LiveCall]:
    calls: list[LiveCall] = []
    i = len(text) - len(text.lstrip())
    if text.startswith("```", i):
        nl = text.find("\n", i)
        if nl < 0:
            return calls
        i = nl + 1
    depth = 0
    in_str = esc = False
    str_start = 0
    key: str | None = None
    expect = "key"  # inside a call object, at its top level: key | colon | value | comma
    cur = LiveCall()
    for idx in range(i, len(text)):
        ch = text[idx]
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
                if depth == 1:
                    literal = text[str_start:idx + 1]
                    if expect == "key":
                        key, expect = _string(literal), "colon"
                    elif expect == "value":
                        if key == "name":
                            cur.name = _string(literal)
                        elif key in ARGUMENT_KEYS:
                            cur.args_end = idx + 1
                        expect = "comma"
            continue
        if ch == '"':
            in_str, str_start = True, idx
            if depth == 1 and expect == "value" and key in ARGUMENT_KEYS:
                cur.args_start = idx
            continue
        if ch in "{[":
            if depth == 0:
                if ch == "{":  # a top-level "[" only lists calls: it adds no depth
                    cur = LiveCall()
                    calls.append(cur)
                    depth, expect, key = 1, "key", None
                continue
            if depth == 1 and expect == "value" and key in ARGUMENT_KEYS:
                cur.args_start, cur.args_object = idx, ch == "{"
            depth += 1
            continue
        if ch in "}]":
            if depth == 0:
                continue
            depth -= 1
            if depth == 0:
                cur.closed, cur.end = True, idx + 1
                if expect == "value" and key in ARGUMENT_KEYS and cur.args_start is not None \
                        and cur.args_end is None:
                    cur.args_end = idx  # a primitive value ended by the object's close
            elif depth == 1:
                if expect == "value" and key in ARGUMENT_KEYS:
                    cur.args_end = idx + 1
                expect = "comma"
            continue
        if depth != 1:
            continue
        if ch == ":" and expect == "colon":
            expect = "value"
        elif ch == ",":
            if expect == "value" and key in ARGUMENT_KEYS and cur.args_start is not None \
                    and cur.args_end is None:
                cur.args_end = idx
            expect, key = "key", None
        elif expect == "value" and not ch.isspace() and key in ARGUMENT_KEYS and cur.args_start is None:
            cur.args_start = idx  # a number, true, false or null: not streamed
    return calls
