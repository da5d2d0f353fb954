"""Tool calling through the HTTP API (scripted engine): request checks, history, responses, SSE
deltas assembled by the OpenAI SDK itself."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient
from openai import OpenAI

from edge.runtime.text.chat_template import TemplateInfo
from edge.runtime.types import GenerationRequest
from tests.fakes import CHAT, ScriptedEngine, make_app, sse_events

HERMES = TemplateInfo("model", None, tools=True, tool_format="hermes")
NO_TOOLS = TemplateInfo("model", None, tools=False, tool_format=None)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
ADD = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}
CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def pieces(text: str, n: int = 5) -> list[str]:
    return [text[i:i + n] for i in range(0, len(text), n)]


def make(
    output: str = CALL_TEXT, info: TemplateInfo | None = HERMES, **kw: Any
) -> tuple[TestClient, ScriptedEngine]:
    def script(_: GenerationRequest) -> list[str]:
        return pieces(output)

    app, engine = make_app(ScriptedEngine(script=script, template_info=info, n_ctx=256), **kw)
    return TestClient(app), engine


def body(**kw: Any) -> dict[str, Any]:
    return {**CHAT, "tools": [WEATHER, ADD], **kw}


def test_auto_tool_call_response_shape() -> None:
    client, engine = make()
    r = client.post("/v1/chat/completions", json=body())
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    msg = choice["message"]
    assert msg["role"] == "assistant" and msg["content"] is None
    [call] = msg["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    _, tools = engine.rendered[-1]
    assert tools == [WEATHER, ADD]  # the template sees them in the HF shape
    assert engine.submitted[-1].sampling.grammar is None  # auto: no constraint


def test_auto_plain_answer_stays_content() -> None:
    client, _ = make("It is sunny in Paris.")
    choice = client.post("/v1/chat/completions", json=body()).json()["choices"][0]
    assert choice["message"]["content"] == "It is sunny in Paris." and "tool_calls" not in choice["message"]
    assert choice["finish_reason"] == "stop"


def test_required_and_named_set_a_grammar_in_the_family_syntax() -> None:
    client, engine = make()
    assert client.post("/v1/chat/completions", json=body(tool_choice="required")).status_code == 200
    g = engine.submitted[-1].sampling.grammar
    assert g is not None and g.startswith('root ::= "<tool_call>\\n" edge-tool-call')
    assert '"\\"get_weather\\""' in g and '"\\"add\\""' in g
    named = {"type": "function", "function": {"name": "add"}}
    r = client.post("/v1/chat/completions", json=body(tool_choice=named, parallel_tool_calls=True))
    assert r.status_code == 200
    g = engine.submitted[-1].sampling.grammar
    assert g is not None and '"\\"add\\""' in g and "get_weather" not in g
    assert g.splitlines()[0].endswith(")*")  # parallel: one or more calls


def test_tool_choice_none_hides_the_tools_even_without_template_support() -> None:
    client, engine = make("plain", info=NO_TOOLS)
    r = client.post("/v1/chat/completions", json=body(tool_choice="none"))
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "plain"
    assert engine.rendered[-1][1] is None


def test_template_without_tools_is_a_clear_400() -> None:
    client, engine = make(info=NO_TOOLS)
    r = client.post("/v1/chat/completions", json=body())
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "tools" and "no tool support" in err["message"]
    assert "--chat-template chatml-tools" in err["message"]
    assert engine.submitted == []


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools[0].function.name"),
        ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools[0].function.name"),
        ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name"),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "add"}}},
         "tool_choice.function.name"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
        ({"tools": [WEATHER], "response_format": {"type": "json_object"}}, "response_format"),
        ({"tools": [WEATHER, {"type": "function", "function": {"name": "x", "parameters": {
            "type": "object", "properties": {"p": {"$ref": "https://example.com/s.json"}}}}}]},
         "tools[1].function.parameters"),
        ({"tools": "get_weather"}, "tools"),
    ],
)
def test_bad_tool_fields_are_400_naming_the_field(extra: dict[str, Any], param: str) -> None:
    client, engine = make()
    r = client.post("/v1/chat/completions", json={**CHAT, **extra})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.json()
    assert engine.submitted == []


def test_tools_on_completions_are_refused() -> None:
    client, _ = make()
    r = client.post("/v1/completions", json={"model": "scripted-model", "prompt": "x", "tools": [WEATHER]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools"


HISTORY = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 21}'},
]


def test_history_with_tool_calls_and_results_reaches_the_template() -> None:
    client, engine = make("It is 21 degrees in Paris.")
    r = client.post("/v1/chat/completions", json=body(messages=HISTORY))
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == "It is 21 degrees in Paris."
    messages, _ = engine.rendered[-1]
    call = messages[1]["tool_calls"][0]
    assert messages[1]["content"] == "" and call["id"] == "call_1"
    args = call["function"]["arguments"]
    assert args == {"city": "Paris"} and str(args) == '{"city": "Paris"}'  # a mapping that prints as JSON
    assert messages[2] == {"role": "tool", "content": '{"temp_c": 21}', "tool_call_id": "call_1",
                           "name": "get_weather"}


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        ([*HISTORY[:2], {"role": "tool", "tool_call_id": "call_9", "content": "x"}],
         "messages[2].tool_call_id"),
        ([HISTORY[0], {"role": "tool", "tool_call_id": "call_1", "content": "x"}],
         "messages[1].tool_call_id"),
        ([*HISTORY[:2], {"role": "tool", "content": "x"}], "messages[2].tool_call_id"),
        ([{"role": "user", "content": "x", "tool_calls": HISTORY[1]["tool_calls"]}],
         "messages[0].tool_calls"),
        ([HISTORY[0], {"role": "assistant", "tool_calls": [{"id": "c", "function": {"arguments": "{}"}}]}],
         "messages[1].tool_calls[0].function.name"),
    ],
)
def test_bad_history_is_400_naming_the_message(messages: list[dict[str, Any]], param: str) -> None:
    client, engine = make()
    r = client.post("/v1/chat/completions", json=body(messages=messages))
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param, err
    if param.endswith("tool_call_id") and "call_9" in json.dumps(messages):
        assert "call_9" in err["message"]
    assert engine.submitted == []


def test_stream_sends_tool_call_deltas_with_index_as_they_decode() -> None:
    two = CALL_TEXT + '\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    client, _ = make("Checking.\n" + two)  # the scripted engine emits 5 characters per token
    r = client.post("/v1/chat/completions", json=body(stream=True))
    events = sse_events(r.content)
    assert events[-1] == "[DONE]"
    deltas = [e["choices"][0]["delta"] for e in events[:-1]]
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert all(len(d["tool_calls"]) == 1 for d in deltas if "tool_calls" in d)
    for index, name, want in ((0, "get_weather", {"city": "Paris"}), (1, "add", {"a": 1, "b": 2})):
        mine = [c for c in calls if c["index"] == index]
        assert mine[0]["id"].startswith("call_")
        assert mine[0]["function"] == {"name": name, "arguments": ""}
        assert all("id" not in c and "name" not in c["function"] for c in mine[1:])
        pieces = [c["function"]["arguments"] for c in mine[1:]]
        assert len(pieces) > 2  # token by token, not one whole call at the end
        assert json.loads("".join(pieces)) == want
    assert [c["index"] for c in calls] == sorted(c["index"] for c in calls)  # call 0 ends before call 1
    assert "".join(d.get("content") or "" for d in deltas) == "Checking."
    assert events[-2]["choices"][0]["finish_reason"] == "tool_calls"


def _sdk(client: TestClient) -> OpenAI:
    return OpenAI(api_key="unused", base_url=str(client.base_url) + "/v1", http_client=client, max_retries=0)


def test_openai_sdk_parses_calls_and_assembles_streamed_deltas() -> None:
    client, _ = make(CALL_TEXT)
    sdk = _sdk(client)
    out = sdk.chat.completions.create(model="scripted-model", messages=CHAT["messages"], tools=[WEATHER])
    assert out.choices[0].finish_reason == "tool_calls"
    assert json.loads(out.choices[0].message.tool_calls[0].function.arguments) == {"city": "Paris"}
    with sdk.chat.completions.stream(model="scripted-model", messages=CHAT["messages"], tools=[WEATHER]) as s:
        done = [e for e in s if e.type == "tool_calls.function.arguments.done"]
        final = s.get_final_completion()
    assert [d.name for d in done] == ["get_weather"] and json.loads(done[0].arguments) == {"city": "Paris"}
    [call] = final.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and call.id.startswith("call_")
    assert final.choices[0].finish_reason == "tool_calls"
