"""Tool-call parsing per family on recorded model outputs, streamed or whole; the call grammar."""

from __future__ import annotations

import json
import re

import pytest

from edge.api.tool_parse import CallScanner, ParsedCall, calls_in
from edge.api.tools import call_grammar
from edge.errors import InvalidRequest

NAMES = frozenset({"get_weather", "add"})

# Recorded from qwen2.5-coder-0.5b-instruct (its own template, the two tools above, greedy unless
# noted): the small model mostly drops the <tool_call> tags Qwen's template asks for.
QWEN_FENCED = ('```json\n{\n  "name": "get_weather",\n  "arguments": {\n    "city": "Paris",\n'
               '    "unit": "celsius"\n  }\n}\n```')
QWEN_BARE = '{"name": "add", "arguments": {"a": 17, "b": 25}}'
QWEN_BARE_PRETTY = '{\n"name": "add",\n"arguments": {"a": 17, "b": 25}\n}'  # temperature 0.7
QWEN_UNKNOWN_NAME = ('{"name": "Short Joke", "arguments": {"short joke": "Why did the tomato turn red? '
                     'Because it saw the salad dressing!"}}')
QWEN_TEXT = ("Sure, here is a short joke for you:\nWhy did the tomato turn red?\n"
             "Because it saw the salad dressing!")
QWEN_TEXT_THEN_FENCE = (
    "To get the weather in Tokyo and Berlin, in Celsius, you can use the `get_weather` function with the "
    "city names and `celsius` as the unit. Here's how you can do it:\n\n```json\n{\n  \"name\": "
    "\"get_weather\",\n  \"arguments\": {\n    \"city\": \"Tokyo\",\n    \"unit\": \"celsius\"\n  }\n}\n"
    "```\n\n"
)
QWEN_JSON_MID_TEXT = ("Here's the output for the given function call:\n{\"name\": \"get_weather\", "
                      "\"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n"
                      "This function call retrieves the weather.")
QWEN_TAGGED = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def scan(text: str, fmt: str = "hermes", *, step: int = 0, forced: bool = False,
         names: frozenset[str] = NAMES) -> tuple[str, list[ParsedCall], list[tuple[str, object]]]:
    """Feed `text` in pieces of `step` characters (0: at once); (content, calls, events)."""
    sc = CallScanner(fmt, names, forced=forced, stream_calls=True)
    events: list[tuple[str, object]] = []
    pieces = [text] if step == 0 else [text[i:i + step] for i in range(0, len(text), step)]
    for p in pieces:
        events += sc.feed(p)
    events += sc.finish()
    content = "".join(str(v) for k, v in events if k == "content")
    calls = [v for k, v in events if k == "call"]
    assert calls == sc.calls
    return content, calls, events  # type: ignore[return-value]


def args(call: ParsedCall) -> object:
    return json.loads(call.arguments)


@pytest.mark.parametrize("step", [0, 1, 2, 7])
@pytest.mark.parametrize(
    ("text", "want_calls", "want_content"),
    [
        (QWEN_FENCED, [("get_weather", {"city": "Paris", "unit": "celsius"})], ""),
        (QWEN_BARE, [("add", {"a": 17, "b": 25})], ""),
        (QWEN_BARE_PRETTY, [("add", {"a": 17, "b": 25})], ""),
        (QWEN_TAGGED, [("get_weather", {"city": "Paris"})], ""),
        (QWEN_UNKNOWN_NAME, [], QWEN_UNKNOWN_NAME),  # not a declared function: an answer, not a call
        (QWEN_TEXT, [], QWEN_TEXT),
        (QWEN_JSON_MID_TEXT, [], QWEN_JSON_MID_TEXT),  # JSON inside prose is prose
        (QWEN_TEXT_THEN_FENCE, [("get_weather", {"city": "Tokyo", "unit": "celsius"})],
         QWEN_TEXT_THEN_FENCE.split("\n\n```")[0]),  # the whitespace around the call is dropped
        ("Here:\n```python\nprint(1)\n```\nDone.", [], "Here:\n```python\nprint(1)\n```\nDone."),
        ("a < b and <tool", [], "a < b and <tool"),
        ('{"x": 1}', [], '{"x": 1}'),
        ("Two calls.\n" + QWEN_TAGGED + '\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}',
         [("get_weather", {"city": "Paris"}), ("add", {"a": 1, "b": 2})], "Two calls."),
    ],
)
def test_hermes_outputs_streamed_in_any_pieces_parse_the_same(
    text: str, want_calls: list[tuple[str, object]], want_content: str, step: int
) -> None:
    content, calls, _ = scan(text, step=step)
    assert [(c.name, args(c)) for c in calls] == want_calls
    assert content == want_content
    assert all(re.fullmatch(r"call_[0-9a-f]{24}", c.id) for c in calls)


def test_tagged_calls_may_name_any_function_bare_json_must_name_a_declared_one() -> None:
    _, calls, _ = scan('<tool_call>\n{"name": "lookup", "arguments": {}}\n</tool_call>')
    assert [c.name for c in calls] == ["lookup"]
    _, calls, _ = scan('{"name": "lookup", "arguments": {}}')
    assert calls == []


def test_possible_call_start_is_held_back_and_prose_streams_at_once() -> None:
    sc = CallScanner("hermes", NAMES)
    assert sc.feed("  ") == [] and sc.feed('{"na') == []  # may still be a bare call
    sc = CallScanner("hermes", NAMES)
    assert sc.feed("Hello <tool") == [("content", "Hello")]  # "<tool" may open a tag; the space waits too
    assert sc.feed("s are great") == [("content", " <tools are great")]
    sc = CallScanner("hermes", NAMES, stream_calls=True)
    ev = sc.feed('Calling.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>')
    assert ev[0] == ("content", "Calling.")  # then the whole call, as soon as the tag closed
    assert [k for k, _ in ev[1:]] == ["call_start", "call_args", "call"]


def test_whitespace_next_to_calls_is_dropped() -> None:
    content, calls, _ = scan("\n\n" + QWEN_TAGGED + "\n\n")
    assert content == "" and len(calls) == 1


def test_llama3_json_and_python_tag() -> None:
    content, calls, _ = scan('{"name": "get_weather", "parameters": {"city": "Oslo"}}', "llama3", step=3)
    assert [(c.name, args(c)) for c in calls] == [("get_weather", {"city": "Oslo"})] and content == ""
    text = 'Let me check.<|python_tag|>{"type": "function", "name": "add", "parameters": {"a": 1, "b": 2}}'
    content, calls, _ = scan(text, "llama3", step=4)
    assert content == "Let me check." and [(c.name, args(c)) for c in calls] == [("add", {"a": 1, "b": 2})]


def test_mistral_marker_and_nine_character_ids() -> None:
    text = ('[TOOL_CALLS] [{"name": "add", "arguments": {"a": 2, "b": 3}}, '
            '{"name": "get_weather", "arguments": {"city": "Rome"}}]')
    content, calls, _ = scan(text, "mistral", step=5)
    assert [c.name for c in calls] == ["add", "get_weather"] and content == ""
    assert all(re.fullmatch(r"[A-Za-z0-9]{9}", c.id) for c in calls)
    # the marker is a control token that detokenizes to nothing: the bare array still counts
    _, calls, _ = scan(text.removeprefix("[TOOL_CALLS] "), "mistral")
    assert [c.name for c in calls] == ["add", "get_weather"]


def test_generic_format_and_openai_shaped_calls() -> None:
    _, calls, _ = scan('{"tool_call": {"name": "add", "arguments": {"a": 1, "b": 1}}}', "generic")
    assert [c.name for c in calls] == ["add"]
    _, calls, _ = scan('[{"type": "function", "function": {"name": "add", "arguments": "{\\"a\\": 1}"}}]',
                       "generic")
    assert [(c.name, c.arguments) for c in calls] == [("add", '{"a": 1}')]  # string arguments kept as sent


def test_forced_output_streams_and_a_call_cut_before_its_name_stays_content() -> None:
    content, calls, events = scan(QWEN_TAGGED, forced=True, step=2)
    assert len(calls) == 1 and content == "" and events[0][0] == "call_start"
    cut = QWEN_TAGGED[:30]  # max_tokens ran out inside the name
    content, calls, _ = scan(cut, forced=True)
    assert calls == [] and content == cut
    cut = QWEN_TAGGED[:60]  # ... inside the arguments: the call had started streaming, it stays a call
    content, calls, _ = scan(cut, forced=True, step=3)
    assert [c.name for c in calls] == ["get_weather"] and content == ""
    assert calls[0].arguments == cut[cut.index('{"city'):]


@pytest.mark.parametrize("bad", ['{"name": "add", "arguments": [1]}', '{"name": "", "arguments": {}}',
                                 '{"name": "add", "arguments": "not json"}', "[1, 2]", '{"name": "add"} x'])
def test_calls_in_rejects_non_calls(bad: str) -> None:
    assert calls_in(bad, NAMES, "generic", any_name=True) is None


WEATHER = {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
           "required": ["city"]}


def test_named_grammar_fixes_the_name_and_wraps_the_family_syntax() -> None:
    g = call_grammar("hermes", [("get_weather", WEATHER)], parallel=False)
    assert g.startswith('root ::= "<tool_call>\\n" edge-tool-call "\\n</tool_call>"\n')
    assert '"\\"get_weather\\""' in g and "add" not in g
    assert re.search(r"^edge-tool-call ::= ", g, re.M) and not re.search(r"^root ::= \"\{", g, re.M)
    assert '"\\"c\\"" | "\\"f\\""' in g  # the enum reaches the grammar
    parallel = call_grammar("hermes", [("get_weather", WEATHER)], parallel=True)
    assert parallel.splitlines()[0].endswith(")*")
    assert call_grammar("llama3", [("get_weather", WEATHER)], False).startswith("root ::= edge-tool-call\n")
    assert '"\\"parameters\\""' in call_grammar("llama3", [("get_weather", WEATHER)], False)
    assert call_grammar("mistral", [("get_weather", WEATHER)], False).startswith('root ::= "[TOOL_CALLS]"')


def test_required_grammar_offers_every_function_and_keeps_their_defs_apart() -> None:
    with_defs = {"type": "object", "properties": {"p": {"$ref": "#/$defs/Point"}},
                 "$defs": {"Point": {"type": "object", "properties": {"x": {"type": "number"}}}}}
    other = {"type": "object", "properties": {"q": {"$ref": "#/definitions/Point"}},
             "definitions": {"Point": {"type": "string"}}}
    g = call_grammar("hermes", [("a", with_defs), ("b", other)], parallel=False)
    assert '"\\"a\\""' in g and '"\\"b\\""' in g
    assert re.search(r"^f0-Point ::= ", g, re.M)  # a's object def, under its own name
    assert re.search(r"^alternative-1-arguments-q ::= string$", g, re.M)  # b's Point is a string


def test_rename_leaves_string_literals_alone() -> None:
    schema = {"type": "object", "properties": {"root": {"type": "string"}}}
    g = call_grammar("generic", [("root", schema)], False)
    assert '"\\"root\\""' in g and "root ::= edge-tool-call" in g


def test_unconvertible_schema_raises() -> None:
    with pytest.raises(InvalidRequest):
        call_grammar("hermes", [("x", {"type": "object", "properties": {"p": {"$ref": "http://elsewhere"}}})],
                     False)


# --- streaming: the name as soon as it is known, then argument pieces ---------------------------


@pytest.mark.parametrize(("fmt", "text", "forced"), [
    ("hermes", QWEN_TAGGED, False),
    ("hermes", QWEN_FENCED, False),
    ("hermes", QWEN_BARE_PRETTY, False),
    ("hermes", QWEN_TAGGED, True),
    ("llama3", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo", "n": [1, {"a": "}"}]}}',
     False),
    ("llama3", '{"name": "get_weather", "parameters": {"city": "Oslo"}}', True),
    ("mistral", '[TOOL_CALLS] [{"name": "add", "arguments": {"a": 2, "b": 3}}, '
                '{"name": "get_weather", "arguments": {"city": "Rome"}}]', False),
    ("generic", '{"name": "add", "arguments": {"a": "x\\"}", "b": 3}}', False),
])
def test_calls_stream_token_by_token_and_the_deltas_join_to_the_arguments(
        fmt: str, text: str, forced: bool) -> None:
    sc = CallScanner(fmt, NAMES, forced=forced, stream_calls=True)
    events: list[tuple[str, object]] = []
    seen_start_at: list[int] = []
    for i, ch in enumerate(text):  # one character per token: the finest a model can stream
        for ev in sc.feed(ch):
            events.append(ev)
            if ev[0] == "call_start":
                seen_start_at.append(i)
    events += sc.finish()
    calls = [v for k, v in events if k == "call"]
    assert calls and calls == sc.calls
    for call in calls:
        assert isinstance(call, ParsedCall)
        starts = [v for k, v in events if k == "call_start" and v.id == call.id]  # type: ignore[attr-defined]
        [start] = starts
        pieces = [v.text for k, v in events if k == "call_args" and v.index == start.index]  # type: ignore[attr-defined]
        assert len(pieces) > 3 and "".join(pieces) == call.arguments
        assert isinstance(json.loads(call.arguments), dict)
    # the first call was announced long before the text ended, while its arguments decoded
    assert seen_start_at[0] < len(text) - 10
    kinds = [k for k, _ in events]
    assert kinds.index("call_start") < kinds.index("call_args") < kinds.index("call")
    assert not [v for k, v in events if k == "content" and str(v).strip()]


def test_an_undeclared_bare_name_is_held_then_released_as_content() -> None:
    sc = CallScanner("hermes", NAMES)
    out = [ev for ch in QWEN_UNKNOWN_NAME for ev in sc.feed(ch)]
    assert out == []  # held: it might have been a call
    assert sc.finish() == [("content", QWEN_UNKNOWN_NAME)]


def test_trailing_prose_after_a_streamed_bare_call_is_content() -> None:
    content, calls, _ = scan(QWEN_BARE + "\nThat adds them.", step=1)
    assert [c.name for c in calls] == ["add"] and content == "That adds them."


def test_without_stream_calls_only_content_and_whole_calls_come_out() -> None:
    """Clients that take whole calls (Ollama's shape) see the events they always did."""
    sc = CallScanner("hermes", NAMES)
    events = [ev for ch in "Sure.\n" + QWEN_TAGGED for ev in sc.feed(ch)] + sc.finish()
    kinds = [k for k, _ in events]
    assert set(kinds) == {"content", "call"} and kinds[-1] == "call" and kinds.count("call") == 1
    assert json.loads(sc.calls[0].arguments) == {"city": "Paris"}
