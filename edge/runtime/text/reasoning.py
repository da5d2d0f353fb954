"""Reasoning kept apart from the answer: a think block's markers and an incremental splitter.

Thinking models open their output with reasoning: a `<think>...</think>` block (Qwen3,
DeepSeek-R1 distills, SmolLM3) or gpt-oss's harmony channels (`<|channel|>analysis<|message|>
... <|end|>`, then `<|start|>assistant<|channel|>final<|message|>` and the answer). As in
llama.cpp's chat parsers, only a block at the start of the output (after whitespace) is
reasoning, or one the prompt opened itself (a template whose generation prompt ends with
`<think>\\n`: `started`); everything after it is content, and content never carries the
markers, so a tool call after the block parses as if there had been no block.

`ReasoningParser` splits text pieces as they come (a marker may arrive split over several
tokens: a possible marker prefix is held back until it is one or is not), and the same parser
run over the whole text gives the same split. `--reasoning-format` picks the markers with
llama-server's meanings (`markers_for`): `auto` the template family's, `deepseek` think tags
(the family's where the template has one), `deepseek-legacy` the same but the content keeps
the whole text, tags included, and `none` no parsing at all (the text as it is).
Pure: no llama.cpp, used by the engine (runtime/step/think.py) and tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple


@dataclass(frozen=True)
class Markers:
    """How one template family writes a think block."""

    family: str  # "think" | "harmony"
    open: str
    close: str
    lead: str = ""  # what the model writes between the close and the answer (dropped too)
    direct: str = ""  # how an answer with no block before it opens (dropped too)
    force_close: str = ""  # what the engine writes to end a block at its budget
    special: bool = False  # the markers are control tokens: pieces are rendered with them


THINK = Markers("think", "<think>", "</think>", force_close="\n</think>\n\n")
HARMONY = Markers("harmony", "<|channel|>analysis<|message|>", "<|end|>",
                  lead="<|start|>assistant<|channel|>final<|message|>", direct="<|channel|>final<|message|>",
                  force_close="<|end|><|start|>assistant<|channel|>final<|message|>", special=True)
FAMILIES: dict[str, Markers] = {m.family: m for m in (THINK, HARMONY)}


def template_family(source: str) -> str | None:
    """The think-block family a chat template teaches (None: the template cannot think)."""
    if "<|channel|>" in source and "analysis" in source:
        return "harmony"
    if "<think>" in source or "enable_thinking" in source:
        return "think"
    return None


def markers_for(reasoning_format: str, family: str | None) -> Markers | None:
    """`--reasoning-format` and the template's family -> the markers to split on (None: none)."""
    if reasoning_format == "none":
        return None
    if family is not None:
        return FAMILIES[family]
    return THINK if reasoning_format.startswith("deepseek") else None


@dataclass(frozen=True)
class ReasoningSpec:
    """What a request asks of the engine about its think block (None on a request: nothing)."""

    markers: Markers
    started: bool = False  # the prompt opened the block (the template wrote the open marker)
    budget_tokens: int | None = None  # reasoning tokens before the engine closes the block itself
    keep_markers: bool = False  # deepseek-legacy: content is the whole text, markers included


def opened_by_prompt(prompt: str, markers: Markers) -> bool:
    """A generation prompt that ends with the open marker: the model starts inside the block."""
    return prompt.rstrip().endswith(markers.open)


class Split(NamedTuple):
    content: str
    reasoning: str


class Phase(str, Enum):
    START = "start"  # only whitespace so far: the block may still open
    REASONING = "reasoning"
    AFTER = "after"  # the block closed: whitespace and the family's lead are dropped
    CONTENT = "content"


def _partial(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0


class ReasoningParser:
    """Text pieces in, `Split(content, reasoning)` out; `finish()` releases what is held back."""

    __slots__ = ("_held", "_said", "keep", "markers", "phase")

    def __init__(self, markers: Markers, started: bool = False, keep_markers: bool = False) -> None:
        self.markers = markers
        self.keep = keep_markers
        self.phase = Phase.REASONING if started else Phase.START
        self._held = ""  # text that may still be part of a marker (or trailing whitespace)
        self._said = False  # some reasoning was emitted (leading whitespace is dropped before)

    @property
    def in_reasoning(self) -> bool:
        return self.phase is Phase.REASONING

    def feed(self, text: str) -> Split:
        content, reasoning = self._step(self._held + text)
        return Split(text if self.keep else content, reasoning)

    def finish(self) -> Split:
        """End of output: whatever was held back was not a marker after all."""
        held, self._held = self._held, ""
        if self.phase is Phase.REASONING:
            return Split("", held.rstrip() if self._said else held.strip())
        return Split("" if self.keep else held, "")

    def _step(self, text: str) -> tuple[str, str]:
        self._held = ""
        content = reasoning = ""
        while text:
            if self.phase is Phase.CONTENT:
                return content + text, reasoning
            if self.phase is Phase.START:
                text = self._start(text)
            elif self.phase is Phase.REASONING:
                said, text = self._reasoning(text)
                reasoning += said
            else:
                text = self._after(text)
        return content, reasoning

    def _start(self, text: str) -> str:
        body, m = text.lstrip(), self.markers
        if body.startswith(m.open):
            self.phase = Phase.REASONING
            return body[len(m.open):]
        if m.direct and body.startswith(m.direct):
            self.phase = Phase.CONTENT
            return body[len(m.direct):]
        if not body or m.open.startswith(body) or (m.direct and m.direct.startswith(body)):
            self._held = text  # whitespace, or a marker's beginning
            return ""
        self.phase = Phase.CONTENT
        return text

    def _reasoning(self, text: str) -> tuple[str, str]:
        """(reasoning to emit, text after the close marker)."""
        if not self._said:
            text = text.lstrip()
        close = self.markers.close
        cut = text.find(close)
        if cut >= 0:
            self.phase = Phase.AFTER
            said = text[:cut].rstrip()
            self._said = self._said or bool(said)
            return said, text[cut + len(close):]
        keep = _partial(text, close)
        body = text[: len(text) - keep]
        said = body.rstrip()
        self._held = body[len(said):] + text[len(text) - keep:]
        self._said = self._said or bool(said)
        return said, ""

    def _after(self, text: str) -> str:
        body = text.lstrip()
        lead = self.markers.lead
        if not body or (lead and lead.startswith(body) and body != lead):
            self._held = body  # dropped whitespace, or the lead's beginning
            return ""
        self.phase = Phase.CONTENT
        return body[len(lead):] if lead and body.startswith(lead) else body


def split_text(text: str, markers: Markers, started: bool = False, keep_markers: bool = False) -> Split:
    """A whole output at once: the same split the incremental parser gives."""
    parser = ReasoningParser(markers, started, keep_markers)
    a, b = parser.feed(text), parser.finish()
    return Split(a.content + b.content, a.reasoning + b.reasoning)
