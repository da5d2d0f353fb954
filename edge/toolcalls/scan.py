"""Parsing tool calls out of model output, incrementally, as they decode.

The model writes calls in the syntax its chat template taught it (`fmt`, from
`edge.runtime.text.chat_template.tool_format`): hermes `<tool_call>{json}</tool_call>`,
llama3 `{"name", "parameters"}` (maybe after `<|python_tag|>`), mistral
`[TOOL_CALLS] [...]`, or generic bare JSON. llama.cpp's server chat parsers are the
reference. Small models often drop the tags and write the bare JSON or a ```json block;
those count as calls only when they name a declared function, so ordinary JSON in an
answer stays content.

`CallScanner` is the one parser, fed incrementally: text that cannot be part of a call
streams as content at once, a possible start of a call is held back (as the detokenizer
holds back a possible stop string) until it is ruled out or the call is known. A call is
known as soon as its function name is complete and its arguments object has begun (inside
an explicit marker any name, elsewhere only a declared one): from then on the call streams,
its name first (`CallStart`), then the raw text of its arguments as it decodes (`ArgsDelta`),
then the whole call (`ParsedCall`, whose `arguments` are exactly the deltas joined). A call
that started streaming stays a call, even when the model stops inside its arguments.
"""

from __future__ import annotations

import json
import re
import secrets
import string
from dataclasses import dataclass, field
from typing import Any

from edge.toolcalls.live import LiveCall, live_calls


@dataclass(frozen=True)
class ParsedCall:
    """One whole call: `arguments` is a JSON object as text (the model's own text when it wrote an
    object, so that it equals the streamed deltas joined)."""

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


@dataclass(frozen=True)
class CallStart:
    """A call's name is known: `index` counts the calls of this output from 0."""

    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ArgsDelta:
    """The next piece of a started call's arguments text."""

    index: int
    text: str


@dataclass
class _Open:
    """A call that started streaming in the current block: what of its arguments went out."""

    index: int
    id: str
    name: str
    args_start: int
    sent: int  # region index up to which the arguments were emitted


Event = tuple[str, Any]  # ("content", str) | ("call_start", CallStart) | ("call_args", ArgsDelta)
#                          | ("call", ParsedCall)


@dataclass
class CallScanner:
    """Incremental split of model output into content and tool calls (see the module docstring).

    `feed(text)` and `finish()` return events: content and, per call, call_start, call_args (zero
    or more), call, in that order; without `stream_calls` only content and call (a client that
    takes whole calls). `forced` (grammar-constrained output): any function name counts.
    """

    fmt: str
    names: frozenset[str]
    forced: bool = False
    stream_calls: bool = False
    _buf: str = ""  # output not yet turned into events
    _started: bool = False  # non-whitespace content was emitted: a bare call can no longer start
    _whole: bool = False  # the output (from its start) may be one bare call: hold all of it
    _block: tuple[str, str | None] | None = None  # inside this marker pair; _buf starts at the marker
    _ws: str = ""  # whitespace-only content, sent once more content follows (dropped next to calls)
    _open: list[_Open] = field(default_factory=list)  # calls of the current block that started
    calls: list[ParsedCall] = field(default_factory=list)

    def feed(self, text: str) -> list[Event]:
        return self._shown(self._feed(text))

    def finish(self) -> list[Event]:
        return self._shown(self._finish())

    def _shown(self, events: list[Event]) -> list[Event]:
        return events if self.stream_calls else [e for e in events if e[0] in ("content", "call")]

    def _feed(self, text: str) -> list[Event]:
        self._buf += text
        events: list[Event] = []
        if self._whole:
            self._stream(self._buf, self.forced, events)
            return events
        while True:
            if self._block is not None:
                if not self._close_block(events):
                    opener = self._block[0]
                    self._stream(_inner(opener, self._buf), self._any_name(opener), events)
                    return events
                continue
            if not self._started:
                state = _bare_state(self._buf)
                if state == "yes":
                    self._whole = True
                    self._stream(self._buf, self.forced, events)
                    return events
                if state == "maybe":
                    return events
            opened = self._open_block(events)
            if not opened:
                return events

    def _finish(self) -> list[Event]:
        events: list[Event] = []
        text, self._buf = self._buf, ""
        if self._whole:
            self._complete(text, self.forced, events, fallback=text)
        elif self._block is not None:  # an unclosed block: the model stopped before the close marker
            opener = self._block[0]
            self._block = None
            self._complete(_inner(opener, text), self._any_name(opener), events, fallback=text)
        else:
            self._content(text, events)
        if self._ws and not self.calls:
            events.append(("content", self._ws))
        self._ws = ""
        return events

    # --- internals -------------------------------------------------------------------------
    def _any_name(self, opener: str) -> bool:
        return self.forced or opener in _EXPLICIT

    def _content(self, text: str, events: list[Event]) -> None:
        """Emit content; trailing whitespace waits (it may only separate the text from a call)."""
        body = text.rstrip()
        if not body:
            self._ws += text
            return
        events.append(("content", self._ws + body))
        self._ws = text[len(body):]
        self._started = True

    def _open_block(self, events: list[Event]) -> bool:
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

    def _close_block(self, events: list[Event]) -> bool:
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
        self._complete(_inner(opener, block[:end]), self._any_name(opener), events, fallback=block)
        return True

    def _stream(self, region: str, any_name: bool, events: list[Event]) -> None:
        """Start the calls of an unfinished block whose name is known, and send their new argument
        text. Calls start in order: one that cannot stream yet holds back the ones after it."""
        for k, live in enumerate(live_calls(region)):
            if k == len(self._open):
                if not (live.name and live.args_object and live.args_start is not None
                        and (any_name or live.name in self.names)):
                    return
                call = _Open(len(self.calls) + k, new_call_id(self.fmt), live.name, live.args_start,
                             live.args_start)
                self._open.append(call)
                events.append(("call_start", CallStart(call.index, call.id, call.name)))
            call = self._open[k]
            end = live.args_end if live.args_end is not None else len(region)
            if end > call.sent:
                events.append(("call_args", ArgsDelta(call.index, region[call.sent:end])))
                call.sent = end

    def _complete(self, region: str, any_name: bool, events: list[Event], fallback: str) -> None:
        """A block is complete (or the output ended in it): its calls, or its text as content."""
        self._stream(region, any_name, events)
        opened, self._open = self._open, []
        parsed = calls_in(region, self.names, self.fmt, any_name=any_name)
        live = live_calls(region)
        if parsed is None:
            if not opened:
                self._content(fallback, events)
                return
            for call in opened:  # a call that started streaming stays a call
                self._end(ParsedCall(call.id, call.name, region[call.args_start:call.sent]), events)
            closed = [lc for lc in live[: len(opened)] if lc.end is not None]
            if len(closed) == len(opened) and closed:
                rest = region[closed[-1].end:].strip().strip("]`").strip()
                if rest:
                    self._content(rest, events)
            return
        for k, call in enumerate(parsed):
            raw = _raw_arguments(region, live[k] if k < len(live) else None, call)
            if k < len(opened):
                started = opened[k]
                tail = raw[started.sent - started.args_start:]
                if tail:
                    events.append(("call_args", ArgsDelta(started.index, tail)))
                self._end(ParsedCall(started.id, started.name, raw), events)
                continue
            index = len(self.calls)
            events.append(("call_start", CallStart(index, call.id, call.name)))
            if raw:
                events.append(("call_args", ArgsDelta(index, raw)))
            self._end(ParsedCall(call.id, call.name, raw), events)

    def _end(self, call: ParsedCall, events: list[Event]) -> None:
        self.calls.append(call)
        events.append(("call", call))


def _raw_arguments(region: str, live: LiveCall | None, call: ParsedCall) -> str:
    """The model's own text of the arguments object when it wrote one where expected, else the
    parsed call's arguments (an encoded string, or another shape)."""
    if (live is not None and live.name == call.name and live.args_object and live.args_start is not None
            and live.args_end is not None):
        return region[live.args_start:live.args_end]
    return call.arguments


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
