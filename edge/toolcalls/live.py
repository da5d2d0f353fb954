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


class _Structure:
    """Where the scan stands outside strings: nesting depth, the current call, and at its top
    level the last key and what is expected next (key | colon | value | comma)."""

    __slots__ = ("calls", "cur", "depth", "expect", "key")

    def __init__(self) -> None:
        self.calls: list[LiveCall] = []
        self.cur = LiveCall()
        self.depth = 0
        self.key: str | None = None
        self.expect = "key"

    def _in_args(self) -> bool:
        return self.expect == "value" and self.key in ARGUMENT_KEYS

    def string_opens(self, idx: int) -> None:
        """A string starts at `idx`, at the call's top level."""
        if self._in_args():
            self.cur.args_start = idx

    def string_closes(self, literal: str, idx: int) -> None:
        """A string ends at `idx`, at the call's top level: a key, a name, or the arguments."""
        if self.expect == "key":
            self.key, self.expect = _string(literal), "colon"
        elif self.expect == "value":
            if self.key == "name":
                self.cur.name = _string(literal)
            elif self.key in ARGUMENT_KEYS:
                self.cur.args_end = idx + 1
            self.expect = "comma"

    def opens(self, idx: int, ch: str) -> None:
        if self.depth == 0:
            if ch == "{":  # a top-level "[" only lists calls: it adds no depth
                self.cur = LiveCall()
                self.calls.append(self.cur)
                self.depth, self.expect, self.key = 1, "key", None
            return
        if self.depth == 1 and self._in_args():
            self.cur.args_start, self.cur.args_object = idx, ch == "{"
        self.depth += 1

    def closes(self, idx: int) -> None:
        if self.depth == 0:
            return
        self.depth -= 1
        cur = self.cur
        if self.depth == 0:
            cur.closed, cur.end = True, idx + 1
            if self._in_args() and cur.args_start is not None and cur.args_end is None:
                cur.args_end = idx  # a primitive value ended by the object's close
        elif self.depth == 1:
            if self._in_args():
                cur.args_end = idx + 1
            self.expect = "comma"

    def top_level(self, idx: int, ch: str) -> None:
        """Any other character at the call's top level: a colon, a comma, or a bare value."""
        cur = self.cur
        if ch == ":" and self.expect == "colon":
            self.expect = "value"
        elif ch == ",":
            if self._in_args() and cur.args_start is not None and cur.args_end is None:
                cur.args_end = idx
            self.expect, self.key = "key", None
        elif self._in_args() and not ch.isspace() and cur.args_start is None:
            cur.args_start = idx  # a number, true, false or null: not streamed


def _body_start(text: str) -> int | None:
    """Index after leading space and an optional fence line; None while the fence line is unfinished."""
    i = len(text) - len(text.lstrip())
    if text.startswith("```", i):
        nl = text.find("\n", i)
        return None if nl < 0 else nl + 1
    return i


def live_calls(text: str) -> list[LiveCall]:
    """The calls in `text` so far (see the module docstring). Strings are skipped inline, the
    bulk of the text; structure goes to `_Structure`."""
    start = _body_start(text)
    if start is None:
        return []
    st = _Structure()
    in_str = esc = False
    str_start = 0
    for idx in range(start, len(text)):
        ch = text[idx]
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
                if st.depth == 1:
                    st.string_closes(text[str_start:idx + 1], idx)
        elif ch == '"':
            in_str, str_start = True, idx
            if st.depth == 1:
                st.string_opens(idx)
        elif ch in "{[":
            st.opens(idx, ch)
        elif ch in "}]":
            st.closes(idx)
        elif st.depth == 1:
            st.top_level(idx, ch)
    return st.calls
