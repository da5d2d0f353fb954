"""Parsing tool calls out of model output, incrementally, and their OpenAI JSON.

The model writes calls in the syntax its chat template taught it (`fmt`, from
`edge.runtime.chat_template.tool_format`): hermes `<tool_call>{json}</tool_call>`,
llama3 `{"name", "parameters"}` (maybe after `<|python_tag|>`), mistral
`[TOOL_CALLS] [...]`, or generic bare JSON. llama.cpp's server chat parsers are the
reference. Small models often drop the tags and write the bare JSON or a ```json block;
those count as calls only when they name a declared function, so ordinary JSON in an
answer stays content.

`CallScanner` is the one parser, fed incrementally: text that cannot be part of a call
streams as content at once, a possible start of a call is held back (as the detokenizer
holds back a possible stop string) until the call is complete or ruled out.
"""

from __future__ import annotations

import json
import re
import secrets
import string
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ParsedCall:
    """One call as OpenAI reports it: `arguments` is a JSON object as text."""

    id: str
    name: str
    arguments: str


def new_call_id(fmt: str) -> str:
    """OpenAI-style ids; Mistral's templates insist on 9 alphanumerics."""
    if fmt == "mistral":
        return "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(9))
    return f"call_{secrets.token_hex(12)}"


# (open marker, close marker or None for "to the end") per family; a fence is tried for all
_BLOCKS: dict[str, tuple[tuple[str, str | None], ...]] = {
    "hermes": (("<tool_call>", "</tool_call>"), ("```", "```")),
    "llama3": (("<|python_tag|>", None), ("```", "```")),
    "mistral": (("[TOOL_CALLS]", None), ("```", "```")),
    "generic": (("```", "```"),),
}
_EXPLICIT = frozenset({"<tool_call>", "<|python_tag|>", "[TOOL_CALLS]"})  # any function name counts
# whitespace-free starts of a bare JSON call at the very beginning of the output
_BARE_STARTS = tuple(
    fence + arr + "{" + key
    for fence in ("```json", "```", "")
    for arr in ("[", "")
    for key in ('"name"', '"type"', '"function"', '"tool_call"', '"tool_calls"')
)
_FENCE = re.compile(r"^```[A-Za-z]*\s*(.*?)\s*(?:```)?$", re.S)  # the model may stop before the close


def calls_in(text: str, names: frozenset[str], fmt: str, *, any_name: bool) -> list[ParsedCall] | None:
    """The calls `text` consists of (JSON objects or arrays of them, optionally fenced), or None
    when it is not only calls. Without `any_name`, every call must name one of `names`."""
    body = text.strip()
    m = _FENCE.match(body)
    if m:
        body = m.group(1)
    dec = json.JSONDecoder()
    calls: list[ParsedCall] = []
    pos = 0
    while True:
        while pos < len(body) and body[pos] in " \t\r\n,;":
            pos += 1
        if pos >= len(body):
            break
        try:
            value, pos = dec.raw_decode(body, pos)
        except ValueError:
            return None
        for item in value if isinstance(value, list) else [value]:
            call = _call_of(item, fmt)
            if call is None or (not any_name and call.name not in names):
                return None
            calls.append(call)
    return calls or None


def _call_of(item: Any, fmt: str) -> ParsedCall | None:
    if not isinstance(item, dict):
        return None
    if isinstance(item.get("tool_call"), dict):  # llama.cpp's generic format
        item = item["tool_call"]
    elif isinstance(item.get("function"), dict):  # the OpenAI shape, echoed
        item = {**item["function"], "id": item.get("id")}
    name = item.get("name")
    args = item.get("arguments", item.get("parameters", {}))
    if not isinstance(name, str) or not name:
        return None
    if isinstance(args, str):
        try:
            parsed = json.loads(args)
        except ValueError:
            return None
        if not isinstance(parsed, dict):
            return None
        text = args
    elif isinstance(args, dict):
        text = json.dumps(args, ensure_ascii=False)
    else:
        return None
    return ParsedCall(new_call_id(fmt), name, text)


@dataclass
class CallScanner:
    """Incremental split of model output into content and tool calls (see the module docstring).

    `feed(text)` and `finish()` return events: ("content", text) or ("call", ParsedCall).
    `forced` (grammar-constrained output) holds everything and parses it at the end.
    """

    fmt: str
    names: frozenset[str]
    forced: bool = False
    _buf: str = ""  # output not yet turned into events
    _started: bool = False  # non-whitespace content was emitted: a bare call can no longer start
    _whole: bool = False  # the output (from its start) may be one bare call: hold all of it
    _block: tuple[str, str | None] | None = None  # inside this marker pair; _buf starts at the marker
    _ws: str = ""  # whitespace-only content, sent once more content follows (dropped next to calls)
    calls: list[ParsedCall] = field(default_factory=list)

    def feed(self, text: str) -> list[tuple[str, Any]]:
        self._buf += text
        if self.forced or self._whole:
            return []
        events: list[tuple[str, Any]] = []
        while True:
            if self._block is not None:
                if not self._close_block(events):
                    return events
                continue
            if not self._started:
                state = _bare_state(self._buf)
                if state == "yes":
                    self._whole = True
                    return events
                if state == "maybe":
                    return events
            opened = self._open_block(events)
            if not opened:
                return events

    def finish(self) -> list[tuple[str, Any]]:
        events: list[tuple[str, Any]] = []
        text, self._buf = self._buf, ""
        if self.forced or self._whole:
            self._emit_block(text, any_name=self.forced, events=events)
        elif self._block is not None:  # an unclosed block: the model stopped before the close marker
            opener = self._block[0]
            self._emit_block(_inner(opener, text), any_name=opener in _EXPLICIT, events=events,
                             fallback=text)
        else:
            self._content(text, events)
        if self._ws and not self.calls:
            events.append(("content", self._ws))
        self._ws = ""
        return events

    # --- internals -------------------------------------------------------------------------
    def _content(self, text: str, events: list[tuple[str, Any]]) -> None:
        """Emit content; trailing whitespace waits (it may only separate the text from a call)."""
        body = text.rstrip()
        if not body:
            self._ws += text
            return
        events.append(("content", self._ws + body))
        self._ws = text[len(body):]
        self._started = True

    def _open_block(self, events: list[tuple[str, Any]]) -> bool:
        """Emit content up to the next opening marker; True when a block was entered."""
        best: tuple[int, tuple[str, str | None]] | None = None
        for pair in _BLOCKS[self.fmt]:
            i = self._buf.find(pair[0])
            if i >= 0 and (best is None or i < best[0]):
                best = (i, pair)
        if best is not None:
            i, pair = best
            self._content(self._buf[:i], events)
            self._buf = self._buf[i:]
            self._block = pair
            return True
        hold = max((_partial_suffix(self._buf, pair[0]) for pair in _BLOCKS[self.fmt]), default=0)
        cut = len(self._buf) - hold
        self._content(self._buf[:cut], events)
        self._buf = self._buf[cut:]
        return False

    def _close_block(self, events: list[tuple[str, Any]]) -> bool:
        """Turn a complete block into calls (or content); False while it is still open."""
        assert self._block is not None
        opener, closer = self._block
        if closer is None:
            return False  # runs to the end of the output
        end = self._buf.find(closer, len(opener))
        if end < 0:
            return False
        block, self._buf = self._buf[: end + len(closer)], self._buf[end + len(closer):]
        self._block = None
        self._emit_block(_inner(opener, block[:end]), any_name=opener in _EXPLICIT, events=events,
                         fallback=block)
        return True

    def _emit_block(self, text: str, *, any_name: bool, events: list[tuple[str, Any]],
                    fallback: str | None = None) -> None:
        calls = self._parse(text, any_name)
        if calls:
            self.calls.extend(calls)
            events.extend(("call", c) for c in calls)
        else:
            self._content(fallback if fallback is not None else text, events)

    def _parse(self, text: str, any_name: bool) -> list[ParsedCall] | None:
        calls = calls_in(text, self.names, self.fmt, any_name=any_name)
        if calls is not None or not self.forced:
            return calls
        # forced output in the family's own syntax (hermes tags, mistral's marker): scan it
        sub = CallScanner(self.fmt, self.names)
        events = sub.feed(text) + sub.finish()
        if sub.calls and all(kind == "call" or not str(v).strip() for kind, v in events):
            return sub.calls
        return None


def _inner(opener: str, block: str) -> str:
    """The text of a block without its opening marker (a fence keeps it: `calls_in` strips fences)."""
    return block if opener == "```" else block[len(opener):]


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def _bare_state(text: str) -> str:
    """'yes' when the output so far starts like a bare JSON call, 'maybe' while it still could,
    'no' once it cannot (whitespace is ignored, as the model may pretty-print)."""
    squeezed = re.sub(r"\s+", "", text[:256])
    if not squeezed:
        return "maybe"
    for start in _BARE_STARTS:
        if squeezed.startswith(start):
            return "yes"
        if start.startswith(squeezed):
            return "maybe"
    return "no"


def call_json(c: ParsedCall) -> dict[str, Any]:
    """A call in a chat.completion message."""
    return {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}


def call_deltas(index: int, c: ParsedCall) -> list[dict[str, Any]]:
    """How OpenAI streams one call: id, type and name with empty arguments, then the arguments."""
    return [
        {"tool_calls": [{"index": index, "id": c.id, "type": "function",
                         "function": {"name": c.name, "arguments": ""}}]},
        {"tool_calls": [{"index": index, "function": {"arguments": c.arguments}}]},
    ]
