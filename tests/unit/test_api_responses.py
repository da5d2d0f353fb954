"""/v1/responses against the scripted engine: parsing and item conversion, output and stream
events (checked by the openai SDK's own stream accumulator too), tools, the response store."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient
from openai import OpenAI

from edge.api.response_store import ResponseStore
from edge.api.responses import to_messages
from edge.api.responses_schemas import parse_responses_request
from edge.clock import ManualClock
from edge.errors import EngineStopped, InvalidRequest
from edge.runtime.text.chat_template import TemplateInfo
from edge.runtime.types import GenerationRequest
from tests.fakes import ScriptedEngine, make_app

HERMES = TemplateInfo("model", None, tools=True, tool_format="hermes")
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
WEATHER: Any = {"type": "function", "name": "get_weather", "description": "Weather in a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
M = "scripted-model"


class Script:
    """Scripted output, 5 characters per token; `text` may change between requests."""

    def __init__(self, text: str = "Hello there friend") -> None:
        self.text = text

    def __call__(self, _: GenerationRequest) -> list[str]:
        return [self.text[i:i + 5] for i in range(0, len(self.text), 5)]


def make(text: str = "Hello there friend", **kw: Any) -> tuple[TestClient, ScriptedEngine, Script]:
    script = Script(text)
    engine = ScriptedEngine(script=script, template_info=HERMES, n_ctx=512,
                            fail_with=kw.pop("fail_with", None))
    app, engine = make_app(engine, **kw)
    return TestClient(app), engine, script


def sdk(client: TestClient) -> OpenAI:
    return OpenAI(api_key="unused", base_url=str(client.base_url) + "/v1", http_client=client, max_retries=0)


def events(raw: bytes) -> list[dict[str, Any]]:
    """Parse the SSE body strictly: `event: TYPE` then `data: JSON` whose type matches."""
    out = []
    for block in raw.decode().split("\n\n")[:-1]:
        lines = block.split("\n")
        assert lines[0].startswith("event: ") and lines[1].startswith("data: "), block
        data = json.loads(lines[1][len("data: "):])
        assert data["type"] == lines[0][len("event: "):]
        out.append(data)
    assert [e["sequence_number"] for e in out] == list(range(len(out)))
    return out


# --- parsing and conversion -------------------------------------------------------------------


def test_items_become_chat_messages_instructions_first_calls_join_the_assistant_turn() -> None:
    body = parse_responses_request({"model": M, "instructions": "Be brief.", "input": [
        {"role": "user", "content": "weather?"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Oslo"}'},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"role": "user", "content": [{"type": "input_text", "text": "and "},
                                     {"type": "input_text", "text": "Rome?"}]},
    ]})
    assert not isinstance(body.input, str)
    msgs = to_messages(body.instructions, list(body.input))
    assert [m.role for m in msgs] == ["system", "user", "assistant", "tool", "user"]
    assert msgs[2].content == "Checking." and msgs[2].tool_calls is not None
    assert [c.id for c in msgs[2].tool_calls] == ["c1"]
    assert msgs[3].tool_call_id == "c1" and msgs[3].content == "sunny"
    assert msgs[4].content == "and Rome?"


@pytest.mark.parametrize(("extra", "param"), [
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"tools": [{"type": "file_search", "vector_store_ids": []}]}, "tools[0].type"),
    ({"background": True}, "background"),
    ({"reasoning": {"effort": "high"}}, "reasoning.effort"),
    ({"conversation": "conv_1"}, "conversation"),
    ({"frobnicate": 1}, "frobnicate"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0]"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input[0].content[0].type"),
    ({"input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}]}, "input[0].call_id"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"max_output_tokens": 10**7}, "max_output_tokens"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
    ({"tool_choice": {"type": "function", "name": "nope"}, "tools": [WEATHER]}, "tool_choice.name"),
    ({"tools": [WEATHER], "text": {"format": {"type": "json_object"}}}, "text.format"),
    ({"input": []}, "input"),
])
def test_unsupported_or_bad_fields_are_a_400_naming_the_param(extra: dict[str, Any], param: str) -> None:
    client, engine, _ = make()
    r = client.post("/v1/responses", json={"model": M, "input": "hi", **extra})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error" and err["message"]
    assert engine.submitted == []


def test_harmless_fields_are_accepted_and_ignored() -> None:
    client, _, _ = make()
    r = client.post("/v1/responses", json={
        "model": M, "input": "hi", "user": "u", "service_tier": "auto",
        "include": ["reasoning.encrypted_content"],
        "truncation": "disabled", "stream_options": {"include_obfuscation": False}, "metadata": {"k": "v"},
        "reasoning": {"effort": None}, "background": False, "safety_identifier": "s", "prompt_cache_key": "p",
        "text": {"verbosity": "low"}, "parallel_tool_calls": True})
    assert r.status_code == 200, r.text
    assert r.json()["metadata"] == {"k": "v"}


# --- output and events ------------------------------------------------------------------------


def test_plain_response_shape_usage_and_sampling() -> None:
    client, engine, _ = make()
    r = client.post("/v1/responses", json={"model": M, "input": "hi there", "instructions": "Be brief.",
                                           "temperature": 0.2, "top_p": 0.5, "max_output_tokens": 50})
    body = r.json()
    assert body["object"] == "response" and body["id"].startswith("resp_") and body["status"] == "completed"
    [item] = body["output"]
    assert item["type"] == "message" and item["role"] == "assistant" and item["status"] == "completed"
    assert item["content"][0] == {"type": "output_text", "text": "Hello there friend", "annotations": [],
                                  "logprobs": []}
    # "<system> Be brief. <user> hi there <assistant>" = 7 words; 4 tokens of 5 characters
    assert body["usage"] == {"input_tokens": 7, "input_tokens_details": {"cached_tokens": 0},
                             "output_tokens": 4, "output_tokens_details": {"reasoning_tokens": 0},
                             "total_tokens": 11}
    req = engine.submitted[-1]
    assert req.max_tokens == 50 and req.sampling.temperature == 0.2 and req.sampling.top_p == 0.5
    assert body["instructions"] == "Be brief." and body["temperature"] == 0.2
    assert sdk(client).responses.create(model=M, input="hi").output_text == "Hello there friend"


def test_cut_output_is_incomplete() -> None:
    client, _, _ = make()
    body = client.post("/v1/responses", json={"model": M, "input": "hi", "max_output_tokens": 2}).json()
    assert body["status"] == "incomplete" and body["incomplete_details"] == {"reason": "max_output_tokens"}
    item = body["output"][0]
    assert item["status"] == "incomplete" and item["content"][0]["text"] == "Hello ther"
    evs = events(client.post("/v1/responses", json={"model": M, "input": "hi", "max_output_tokens": 2,
                                                    "stream": True}).content)
    assert evs[-1]["type"] == "response.incomplete" and evs[-1]["response"]["status"] == "incomplete"


def test_text_stream_event_sequence() -> None:
    client, _, _ = make()
    r = client.post("/v1/responses", json={"model": M, "input": "hi", "stream": True})
    assert r.headers["content-type"].startswith("text/event-stream")
    evs = events(r.content)
    assert [e["type"] for e in evs] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * 4, "response.output_text.done", "response.content_part.done",
        "response.output_item.done", "response.completed"]
    assert evs[0]["response"]["status"] == "in_progress" and evs[0]["response"]["output"] == []
    text = "".join(e["delta"] for e in evs if e["type"] == "response.output_text.delta")
    assert text == "Hello there friend"
    done = evs[-1]["response"]
    assert done["status"] == "completed" and done["output"][0]["content"][0]["text"] == "Hello there friend"
    assert done["id"] == evs[0]["response"]["id"] and done["usage"]["output_tokens"] == 4
    with sdk(client).responses.stream(model=M, input="hi") as s:
        kinds = [e.type for e in s]
        final = s.get_final_response()
    assert kinds[-1] == "response.completed" and final.output_text == "Hello there friend"


def test_tool_call_streams_argument_deltas_then_round_trip_with_function_call_output() -> None:
    client, engine, script = make("Let me check.\n" + CALL)
    evs = events(client.post("/v1/responses", json={"model": M, "input": "weather?", "tools": [WEATHER],
                                                    "stream": True}).content)
    kinds = [e["type"] for e in evs]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    i = kinds.index("response.output_item.done")  # the text message closes before the call opens
    assert kinds[i + 1] == "response.output_item.added" and evs[i + 1]["item"]["type"] == "function_call"
    assert evs[i + 1]["item"]["name"] == "get_weather" and evs[i + 1]["item"]["arguments"] == ""
    deltas = [e["delta"] for e in evs if e["type"] == "response.function_call_arguments.delta"]
    assert len(deltas) > 2 and json.loads("".join(deltas)) == {"city": "Paris"}
    assert all(e["output_index"] == 1 for e in evs if e["type"].startswith("response.function_call"))
    [args_done] = [e for e in evs if e["type"] == "response.function_call_arguments.done"]
    assert args_done["arguments"] == "".join(deltas)
    final = evs[-1]["response"]
    assert [o["type"] for o in final["output"]] == ["message", "function_call"]
    assert final["output"][0]["content"][0]["text"] == "Let me check."

    client_sdk = sdk(client)
    with client_sdk.responses.stream(model=M, input="weather?", tools=[WEATHER]) as s:
        list(s)
        first = s.get_final_response()
    [call] = [o for o in first.output if o.type == "function_call"]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    script.text = "It is sunny in Paris."
    second = client_sdk.responses.create(
        model=M, previous_response_id=first.id, tools=[WEATHER],
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": '{"sky": "sunny"}'}])
    assert second.output_text == "It is sunny in Paris." and second.previous_response_id == first.id
    history, tools = engine.rendered[-1]
    assert [m["role"] for m in history] == ["user", "assistant", "tool"]
    assert history[1]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": {"city": "Paris"}}
    assert history[2] == {"role": "tool", "content": '{"sky": "sunny"}', "tool_call_id": call.call_id,
                          "name": "get_weather"}
    assert tools is not None and tools[0]["function"]["name"] == "get_weather"


def test_forced_tool_choice_sets_the_grammar_and_text_format_json_schema_too() -> None:
    client, engine, _ = make(CALL)
    named = {"type": "function", "name": "get_weather"}
    assert client.post("/v1/responses", json={"model": M, "input": "x", "tools": [WEATHER],
                                              "tool_choice": named}).status_code == 200
    g = engine.submitted[-1].sampling.grammar
    assert g is not None and g.startswith('root ::= "<tool_call>\\n"')
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    fmt = {"type": "json_schema", "name": "n", "schema": schema}
    r = client.post("/v1/responses", json={"model": M, "input": "x", "text": {"format": fmt}})
    assert r.status_code == 200
    assert engine.submitted[-1].sampling.grammar is not None
    assert client.post("/v1/responses", json={"model": M, "input": "x",
                                              "text": {"format": {"type": "json_object"}}}).status_code == 200


def test_engine_error_mid_stream_is_an_error_event_then_response_failed() -> None:
    client, _, _ = make(fail_with=EngineStopped("boom"))
    evs = events(client.post("/v1/responses", json={"model": M, "input": "hi", "stream": True}).content)
    kinds = [e["type"] for e in evs]
    assert kinds == ["response.created", "response.in_progress", "error", "response.failed"]
    assert evs[2]["code"] == "engine_stopped" and evs[3]["response"]["status"] == "failed"
    assert evs[3]["response"]["error"]["code"] == "engine_stopped"
    r = client.post("/v1/responses", json={"model": M, "input": "hi"})
    assert r.status_code == 503 and r.json()["error"]["code"] == "engine_stopped"


# --- the store --------------------------------------------------------------------------------


def test_previous_response_chain_get_delete_and_store_false() -> None:
    client, engine, _ = make()
    first = client.post("/v1/responses", json={"model": M, "input": "one"}).json()
    second = client.post("/v1/responses", json={"model": M, "input": "two",
                                                "previous_response_id": first["id"]}).json()
    history, _ = engine.rendered[-1]
    assert [(m["role"], m["content"]) for m in history] == [
        ("user", "one"), ("assistant", "Hello there friend"), ("user", "two")]
    assert client.get(f"/v1/responses/{second['id']}").json() == second
    assert client.delete(f"/v1/responses/{first['id']}").json() == {"id": first["id"], "object": "response",
                                                                    "deleted": True}
    assert client.get(f"/v1/responses/{first['id']}").status_code == 404
    # the second response holds the whole conversation: its chain still resolves
    client.post("/v1/responses", json={"model": M, "input": "three", "previous_response_id": second["id"]})
    assert len(engine.rendered[-1][0]) == 5
    unstored = client.post("/v1/responses", json={"model": M, "input": "x", "store": False}).json()
    assert unstored["store"] is False
    r = client.post("/v1/responses", json={"model": M, "input": "y", "previous_response_id": unstored["id"]})
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "previous_response_not_found"
    assert r.json()["error"]["param"] == "previous_response_id"


def test_evicted_previous_response_is_a_clear_404() -> None:
    client, _, _ = make(responses_store_max=2)
    ids = [client.post("/v1/responses", json={"model": M, "input": f"n{i}"}).json()["id"] for i in range(3)]
    r = client.post("/v1/responses", json={"model": M, "input": "x", "previous_response_id": ids[0]})
    assert r.status_code == 404 and r.json()["error"]["code"] == "previous_response_not_found"
    assert "evicted" in r.json()["error"]["message"]
    assert client.post("/v1/responses", json={"model": M, "input": "x",
                                              "previous_response_id": ids[2]}).status_code == 200


def test_store_is_an_lru_bounded_by_count_bytes_and_age() -> None:
    clock = ManualClock()
    store = ResponseStore(max_entries=2, max_bytes=10_000, ttl_s=60.0, clock=clock.monotonic)
    store.put("a", {"x": 1}, [])
    store.put("b", {"x": 2}, [])
    assert store.get("a") is not None  # a is now the most recently used
    store.put("c", {"x": 3}, [])
    assert store.get("b") is None and store.get("a") is not None and len(store) == 2
    clock.advance(61.0)
    assert store.get("a") is None and store.get("c") is None and len(store) == 0
    assert not store.put("big", {"x": "y" * 20_000}, [])  # alone larger than the bound
    store.put("d", {"x": "y" * 6_000}, [])
    store.put("e", {"x": "y" * 6_000}, [])
    assert store.get("d") is None and store.get("e") is not None and store.size_bytes <= 10_000
    assert ResponseStore(max_entries=0).put("z", {}, []) is False


def test_parse_refuses_non_object_body() -> None:
    with pytest.raises(InvalidRequest):
        parse_responses_request([1, 2])


# --- admission and disconnects: the same as chat ----------------------------------------------


def test_overload_is_503_with_retry_after_and_a_stream_disconnect_frees_the_slot() -> None:
    import asyncio

    from edge.runtime.types import FinishReason
    from tests.fakes import AsgiCall, settle

    async def main() -> None:
        app, engine = make_app(ScriptedEngine(n_slots=1, autostep=False), max_queue=0)
        streaming = AsgiCall(app, "POST", "/v1/responses", {"model": M, "input": "hi", "stream": True})
        task = asyncio.create_task(streaming.run())
        await settle()
        engine.step(2)
        await settle()
        assert b"response.output_text.delta" in streaming.body_bytes
        refused = AsgiCall(app, "POST", "/v1/responses", {"model": M, "input": "hi"})
        await refused.run()
        assert refused.status == 503 and refused.header("retry-after") == "1"
        assert json.loads(refused.body_bytes)["error"]["code"] == "queue_full"
        handle = engine.active[0]
        streaming.disconnect()
        await settle()
        await asyncio.wait_for(task, 1.0)
        assert handle.cancel_requested and app.state.edge.in_flight == {}
        engine.step()
        assert engine.active == [] and handle.finish_reason is FinishReason.CANCELLED
        again = AsgiCall(app, "POST", "/v1/responses", {"model": M, "input": "hi"})
        t = asyncio.create_task(again.run())
        await settle()
        engine.step(10)
        await settle()
        await asyncio.wait_for(t, 1.0)
        assert again.status == 200

    asyncio.run(main())
