"""The reasoning parser (runtime/text/reasoning.py) and a sequence's think state (runtime/step/think.py):
markers split across tokens, a block never closed, tool calls after the block, the none format,
the token count and the budget's forced close."""

from __future__ import annotations

import pytest

from edge.runtime.step.think import ThinkState, think_state
from edge.runtime.text.reasoning import (
    HARMONY,
    THINK,
    Markers,
    ReasoningParser,
    ReasoningSpec,
    Split,
    markers_for,
    opened_by_prompt,
    split_text,
    template_family,
)
from edge.toolcalls import CallScanner

OUTPUT = "\n<think>\nThe user asks 2+2.\nThat is 4. </think>\n\nThe answer is 4."


def pieces(text: str, n: int) -> list[str]:
    return [text[i:i + n] for i in range(0, len(text), n)]


def streamed(parts: list[str], markers: Markers = THINK, **kw: bool) -> Split:
    parser = ReasoningParser(markers, **kw)
    content = reasoning = ""
    for p in [*parts, None]:
        s = parser.feed(p) if p is not None else parser.finish()
        content, reasoning = content + s.content, reasoning + s.reasoning
    return Split(content, reasoning)


@pytest.mark.parametrize("n", [1, 2, 3, 7, 1000])
def test_markers_split_across_pieces_give_the_whole_text_split(n: int) -> None:
    assert streamed(pieces(OUTPUT, n)) == ("The answer is 4.", "The user asks 2+2.\nThat is 4.")
    assert split_text(OUTPUT, THINK) == streamed(pieces(OUTPUT, n))


def test_a_marker_prefix_is_held_back_until_it_is_decided() -> None:
    parser = ReasoningParser(THINK, started=True)
    assert parser.feed("thinking </th") == ("", "thinking")  # "</th" may be the close: held
    assert parser.feed("ought") == ("", " </thought")  # it was not
    assert parser.feed("</think>Hi") == ("Hi", "")
    start = ReasoningParser(THINK)
    assert start.feed("  <thi") == ("", "")
    assert start.feed("nk>x") == ("", "x")


def test_the_prompt_opened_block_and_no_close_marker() -> None:
    assert streamed(pieces("Let me see. 2+2 is", 2), started=True) == ("", "Let me see. 2+2 is")
    assert opened_by_prompt("<|im_start|>assistant\n<think>\n", THINK)
    assert not opened_by_prompt("<|im_start|>assistant\n", THINK)


def test_only_a_block_at_the_start_is_reasoning() -> None:
    text = "Sure. <think>not reasoning</think> done"
    assert split_text(text, THINK) == (text, "")
    assert split_text("<thanks> a lot", THINK) == ("<thanks> a lot", "")
    assert split_text("", THINK) == ("", "")


def test_deepseek_legacy_keeps_the_markers_in_the_content() -> None:
    assert streamed(pieces(OUTPUT, 3), keep_markers=True) == (OUTPUT, "The user asks 2+2.\nThat is 4.")


def test_the_none_format_and_the_families() -> None:
    assert markers_for("none", "think") is None  # the text as the model wrote it
    assert markers_for("auto", None) is None
    assert markers_for("auto", "think") is THINK and markers_for("auto", "harmony") is HARMONY
    assert markers_for("deepseek", None) is THINK and markers_for("deepseek-legacy", "think") is THINK
    assert template_family("{% if enable_thinking %}<think>\n{% endif %}") == "think"
    assert template_family("<|start|>assistant<|channel|>analysis<|message|>") == "harmony"
    assert template_family("<|im_start|>assistant\n") is None


@pytest.mark.parametrize("n", [1, 5, 1000])
def test_harmony_channels(n: int) -> None:
    text = "<|channel|>analysis<|message|>Sum it.<|end|><|start|>assistant<|channel|>final<|message|>4"
    assert streamed(pieces(text, n), HARMONY) == ("4", "Sum it.")
    assert streamed(pieces("<|channel|>final<|message|>4", n), HARMONY) == ("4", "")


@pytest.mark.parametrize("n", [1, 4, 1000])
def test_a_tool_call_after_the_think_block_still_parses(n: int) -> None:
    text = ('<think>\nI should call the weather tool.\n</think>\n\n<tool_call>\n'
            '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')
    content = streamed(pieces(text, n)).content
    scanner = CallScanner("hermes", frozenset({"get_weather"}))
    events = scanner.feed(content) + scanner.finish()
    assert [c.name for c in scanner.calls] == ["get_weather"]
    assert '"Paris"' in scanner.calls[0].arguments
    assert not "".join(v for k, v in events if k == "content").strip()


def _take_all(state: ThinkState, texts: list[str]) -> Split:
    content = reasoning = ""
    for t in texts:
        s = state.take(t)
        content, reasoning = content + s.content, reasoning + s.reasoning
    s = state.finish("")
    return Split(content + s.content, reasoning + s.reasoning)


def test_tokens_are_counted_while_the_block_is_open_markers_included() -> None:
    state = ThinkState(ReasoningSpec(THINK), [])
    tokens = ["\n", "<", "think", ">", "a", " b", "</", "think", ">", "\n\n", "Hi", "!"]
    assert _take_all(state, tokens) == ("Hi!", "a b")
    assert state.n_tokens == 9  # "<" ... ">" of the close: the whitespace before the block is not
    plain = ThinkState(ReasoningSpec(THINK), [])
    assert _take_all(plain, ["Hello", " there"]) == ("Hello there", "") and plain.n_tokens == 0


@pytest.mark.parametrize("budget", [0, 1, 3])
def test_the_budget_forces_the_close_marker_to_the_token(budget: int) -> None:
    close = [901, 902, 903]  # "\n</", "think", ">\n\n"
    text_of = {901: "\n</", 902: "think", 903: ">\n\n"}
    state = ThinkState(ReasoningSpec(THINK, started=True, budget_tokens=budget), close)
    model_says = iter(["I", " think", " more", "Answer", "."])
    taken: list[int | str] = []
    while len(taken) < budget + len(close) + 2:
        forced = state.next_forced()
        tok: int | str = forced if forced is not None else next(model_says)
        taken.append(tok)
        state.take(text_of[tok] if isinstance(tok, int) else tok)
    assert state.n_tokens == budget + len(close)  # <= budget + the close marker's tokens
    assert taken[budget:budget + len(close)] == close and state.closing and not state.due
    assert not state.parser.in_reasoning
    assert all(isinstance(t, str) for t in taken[budget + len(close):])  # then the model answers


def test_no_budget_never_forces_and_a_closed_block_is_not_reopened() -> None:
    state = ThinkState(ReasoningSpec(THINK, started=True), [1])
    for t in ["a"] * 50:
        assert state.next_forced() is None
        state.take(t)
    assert state.n_tokens == 50
    capped = ThinkState(ReasoningSpec(THINK, started=True, budget_tokens=5), [1])
    for t in ["a", "</think>", "b", "c", "d", "e", "f"]:
        assert capped.next_forced() is None  # the model closed the block itself within the budget
        capped.take(t)
    assert capped.n_tokens == 2


def test_think_state_tokenizes_the_close_only_with_a_budget() -> None:
    calls: list[str] = []

    def tokenize(text: str) -> list[int]:
        calls.append(text)
        return [7, 8]

    assert think_state(None, tokenize) is None
    assert think_state(ReasoningSpec(THINK), tokenize) is not None and calls == []
    st = think_state(ReasoningSpec(THINK, budget_tokens=4), tokenize)
    assert st is not None and st.close_tokens == [7, 8] and calls == [THINK.force_close]
    assert think_state(ReasoningSpec(HARMONY), tokenize).special  # type: ignore[union-attr]
