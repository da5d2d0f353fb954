"""OpenAI routes against the scripted engine: formats, SSE framing, usage, parameters."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from edge.runtime.types import Priority
from tests.fakes import CHAT, ScriptedEngine, make_app, sse_events


@pytest.fixture()
def client_engine() -> tuple[TestClient, ScriptedEngine]:
    app, engine = make_app()
    return TestClient(app), engine


def test_chat_non_streaming_shape_and_usage(client_engine: tuple[TestClient, ScriptedEngine]) -> None:
    client, engine = client_engine
    r = client.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "chat.completion"
    assert body["id"].startswith("chatcmpl-")
    choice = body["choices"][0]
    assert choice["message"] == {
        "role": "assistant",
        "content": "".join(f"tok{i} " for i in range(8)),
        "refusal": None,
    }
    assert choice["finish_reason"] == "stop"
    # "<user> hello there <assistant>" = 4 words, no BOS for chat prompts
    n_prompt = len(engine.tokenize(engine.render_chat(CHAT["messages"]), add_bos=False))
    assert body["usage"]["prompt_tokens"] == n_prompt == 4
    assert body["usage"]["completion_tokens"] == 8
    assert body["usage"]["total_tokens"] == 12
    req = engine.submitted[-1]
    assert req.prompt == engine.tokenize(engine.render_chat(CHAT["messages"]), add_bos=False)
    assert req.priority is Priority.INTERACTIVE


def test_chat_stream_framing_and_usage_chunk(client_engine: tuple[TestClient, ScriptedEngine]) -> None:
    client, _ = client_engine
    r = client.post(
        "/v1/chat/completions",
        json={**CHAT, "stream": True, "stream_options": {"include_usage": True}, "max_tokens": 3},
    )
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.content)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    contents = [c["choices"][0]["delta"].get("content") for c in chunks[1:-2]]
    assert contents == ["tok0 ", "tok1 ", "tok2 "]
    assert chunks[-2]["choices"][0] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "length"}
    assert all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == 3
    assert chunks[-1]["usage"]["prompt_tokens"] == 4


def test_chat_stream_without_usage_has_no_usage_key(client_engine: tuple[TestClient, ScriptedEngine]) -> None:
    client, _ = client_engine
    events = sse_events(client.post("/v1/chat/completions", json={**CHAT, "stream": True}).content)
    assert events[-1] == "[DONE]"
    assert all("usage" not in c for c in events[:-1])
    assert events[-2]["choices"][0]["finish_reason"] == "stop"


def test_completions_string_list_and_tokens(client_engine: tuple[TestClient, ScriptedEngine]) -> None:
    client, engine = client_engine
    r = client.post("/v1/completions", json={"model": "scripted-model", "prompt": "a b c", "max_tokens": 2})
    body = r.json()
    assert body["object"] == "text_completion"
    assert body["choices"] == [
        {"text": "tok0 tok1 ", "index": 0, "logprobs": None, "finish_reason": "length"}
    ]
    assert body["usage"]["prompt_tokens"] == 4  # BOS + 3 words
    r = client.post(
        "/v1/completions", json={"model": "scripted-model", "prompt": ["a", "b c"], "max_tokens": 1}
    )
    body = r.json()
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert body["usage"] == {
        "prompt_tokens": 2 + 3,
        "completion_tokens": 2,
        "total_tokens": 7,
        "prompt_tokens_details": {"cached_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0},
    }
    r = client.post("/v1/completions", json={"model": "scripted-model", "prompt": [5, 6, 7], "max_tokens": 1})
    assert r.status_code == 200
    assert engine.submitted[-1].prompt == [5, 6, 7]


def test_completions_default_max_tokens_is_16(client_engine: tuple[TestClient, ScriptedEngine]) -> None:
    client, engine = client_engine
    client.post("/v1/completions", json={"model": "scripted-model", "prompt": "x"})
    assert engine.submitted[-1].max_tokens == 16


def test_completions_stream_framing(client_engine: tuple[TestClient, ScriptedEngine]) -> None:
    client, _ = client_engine
    r = client.post(
        "/v1/completions",
        json={
            "model": "scripted-model",
            "prompt": "hi",
            "max_tokens": 2,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    events = sse_events(r.content)
    assert events[-1] == "[DONE]"
    texts = [(c["choices"][0]["text"], c["choices"][0]["finish_reason"]) for c in events[:-2]]
    assert texts == [("tok0 ", None), ("tok1 ", "length")]
    assert all(c["object"] == "text_completion" for c in events[:-1])
    assert events[-2]["usage"]["completion_tokens"] == 2


def test_sampling_parameters_reach_the_engine(client_engine: tuple[TestClient, ScriptedEngine]) -> None:
    client, engine = client_engine
    r = client.post(
        "/v1/chat/completions",
        json={
            **CHAT,
            "temperature": 0.2,
            "top_p": 0.5,
            "seed": 42,
            "stop": ["\n", "END"],
            "presence_penalty": 0.5,
            "frequency_penalty": -0.5,
            "logit_bias": {"17": -100, "3": 2.5},
            "max_completion_tokens": 5,
            "top_k": 7,
            "min_p": 0.1,
        },
    )
    assert r.status_code == 200, r.text
    req = engine.submitted[-1]
    s = req.sampling
    assert (s.temperature, s.top_p, s.seed, s.presence_penalty, s.frequency_penalty) == (
        0.2,
        0.5,
        42,
        0.5,
        -0.5,
    )
    assert (s.top_k, s.min_p) == (7, 0.1)
    assert s.logit_bias == {17: -100.0, 3: 2.5}
    assert req.stop == ("\n", "END")
    assert req.max_tokens == 5
    client.post("/v1/completions", json={"model": "scripted-model", "prompt": "p", "stop": "X"})
    assert engine.submitted[-1].stop == ("X",)


def test_response_format_json_object_and_schema_set_a_grammar(
    client_engine: tuple[TestClient, ScriptedEngine],
) -> None:
    client, engine = client_engine
    r = client.post("/v1/chat/completions", json={**CHAT, "response_format": {"type": "json_object"}})
    assert r.status_code == 200
    assert "root" in (engine.submitted[-1].sampling.grammar or "")
    schema = {"type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"]}
    r = client.post(
        "/v1/chat/completions",
        json={
            **CHAT,
            "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": schema}},
        },
    )
    assert r.status_code == 200, r.text
    grammar = engine.submitted[-1].sampling.grammar or ""
    assert "age" in grammar and "root" in grammar
    r = client.post("/v1/chat/completions", json={**CHAT, "response_format": {"type": "text"}})
    assert engine.submitted[-1].sampling.grammar is None


def test_default_client_params_are_accepted(client_engine: tuple[TestClient, ScriptedEngine]) -> None:
    client, _ = client_engine
    r = client.post(
        "/v1/chat/completions",
        json={
            **CHAT,
            "n": 1,
            "logprobs": False,
            "user": "u1",
            "parallel_tool_calls": True,
            "store": False,
            "stream_options": {"include_usage": False},
            "tools": None,
            "metadata": {"a": "b"},
        },
    )
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"n": 2}, "n"),
        ({"top_logprobs": 3}, "top_logprobs"),  # needs logprobs: true (logprobs are supported now)
        ({"logprobs": "yes"}, "logprobs"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ({"frobnicate": 1}, "frobnicate"),
        ({"temperature": 3}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"logit_bias": {"abc": 1}}, "logit_bias"),
        ({"logit_bias": {"5": 500}}, "logit_bias"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"stream_options": "yes"}, "stream_options"),
        ({"stop": [str(i) for i in range(17)]}, "stop"),
    ],
)
def test_bad_parameters_are_400_naming_the_param(
    client_engine: tuple[TestClient, ScriptedEngine], extra: dict, param: str
) -> None:
    client, engine = client_engine
    before = len(engine.submitted)
    r = client.post("/v1/chat/completions", json={**CHAT, **extra})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error"
    assert err["param"] == param
    assert len(engine.submitted) == before  # nothing queued


def test_image_content_is_rejected(client_engine: tuple[TestClient, ScriptedEngine]) -> None:
    client, _ = client_engine
    msg = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
    r = client.post("/v1/chat/completions", json={"model": "scripted-model", "messages": [msg]})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "messages[0].content"


def test_text_parts_are_joined(client_engine: tuple[TestClient, ScriptedEngine]) -> None:
    client, engine = client_engine
    msg = {"role": "user", "content": [{"type": "text", "text": "one"}, {"type": "text", "text": " two"}]}
    r = client.post("/v1/chat/completions", json={"model": "scripted-model", "messages": [msg]})
    assert r.status_code == 200
    assert engine.submitted[-1].prompt == engine.tokenize("<user> one two <assistant>", add_bos=False)


def test_invalid_json_and_non_object_body(client_engine: tuple[TestClient, ScriptedEngine]) -> None:
    client, _ = client_engine
    r = client.post(
        "/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    r = client.post("/v1/chat/completions", json=[1, 2])
    assert r.status_code == 400


def test_context_overflow_is_400_with_counts() -> None:
    app, engine = make_app(ScriptedEngine(n_ctx=10))
    client = TestClient(app)
    words = " ".join(["w"] * 20)
    r = client.post("/v1/completions", json={"model": "scripted-model", "prompt": words})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "context_overflow"
    assert "21 tokens" in err["message"] and "10" in err["message"]
    assert engine.submitted == []


def test_max_tokens_cap() -> None:
    app, engine = make_app(max_tokens_cap=8)
    client = TestClient(app)
    r = client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 9})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    client.post("/v1/chat/completions", json=CHAT)
    assert engine.submitted[-1].max_tokens == 8  # default: min(cap, room left in the context)


def test_default_max_tokens_is_room_left_in_context() -> None:
    app, engine = make_app(ScriptedEngine(n_ctx=20))
    TestClient(app).post("/v1/chat/completions", json=CHAT)
    assert engine.submitted[-1].max_tokens == 20 - 4


def test_template_error_is_400() -> None:
    app, _ = make_app(ScriptedEngine(chat_template=False))
    r = TestClient(app).post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "template_error"


def test_unknown_model_is_404_and_aliases_work(client_engine: tuple[TestClient, ScriptedEngine]) -> None:
    client, _ = client_engine
    r = client.post("/v1/chat/completions", json={**CHAT, "model": "gpt-4"})
    assert r.status_code == 404
    assert r.json()["error"]["type"] == "not_found_error"
    assert "scripted-model" in r.json()["error"]["message"]
    assert client.post("/v1/chat/completions", json={**CHAT, "model": "alias.gguf"}).status_code == 200
    tagged = client.post("/v1/chat/completions", json={**CHAT, "model": "scripted-model:latest"})
    assert tagged.status_code == 200 and tagged.json()["model"] == "scripted-model:latest"  # Ollama's tag
    assert client.post("/v1/chat/completions", json={**CHAT, "model": "gpt-4:latest"}).status_code == 404
    models = client.get("/v1/models").json()
    assert models["object"] == "list"
    assert [m["id"] for m in models["data"]] == ["scripted-model"]
    assert client.get("/v1/models/scripted-model").json()["id"] == "scripted-model"
    assert client.get("/v1/models/nope").status_code == 404


def test_engine_error_event_is_not_a_stack_trace() -> None:
    app, _ = make_app(ScriptedEngine(fail_with=RuntimeError("secret internals")))
    client = TestClient(app)
    r = client.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 503
    assert "secret" not in r.text and "Traceback" not in r.text
    events = sse_events(client.post("/v1/chat/completions", json={**CHAT, "stream": True}).content)
    assert "error" in events[-1] and "secret" not in str(events)
    assert "[DONE]" not in events


def test_unknown_route_is_openai_shaped_404(client_engine: tuple[TestClient, ScriptedEngine]) -> None:
    client, _ = client_engine
    r = client.get("/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["message"] == "no such endpoint"


def test_completions_stream_with_several_prompts_interleaves_choices(
    client_engine: tuple[TestClient, ScriptedEngine],
) -> None:
    client, _ = client_engine
    r = client.post(
        "/v1/completions",
        json={
            "model": "scripted-model",
            "prompt": ["a", "b", "c"],
            "max_tokens": 2,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    events = sse_events(r.content)
    assert events[-1] == "[DONE]"
    by_index: dict[int, list[tuple[str, str | None]]] = {}
    for c in events[:-2]:
        ch = c["choices"][0]
        by_index.setdefault(ch["index"], []).append((ch["text"], ch["finish_reason"]))
    assert by_index == {i: [("tok0 ", None), ("tok1 ", "length")] for i in range(3)}
    assert events[-2]["usage"]["completion_tokens"] == 6


def test_unconvertible_json_schema_is_400(client_engine: tuple[TestClient, ScriptedEngine]) -> None:
    client, engine = client_engine
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "no-such-type"}}}
    r = client.post("/v1/chat/completions", json={**CHAT, "response_format": fmt})
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format"
    r = client.post("/v1/chat/completions", json={**CHAT, "response_format": {"type": "json_schema"}})
    assert r.status_code == 400
    assert engine.submitted == []


def test_lone_surrogates_are_400_not_500(client_engine: tuple[TestClient, ScriptedEngine]) -> None:
    client, engine = client_engine
    raw = b'{"model": "scripted-model", "messages": [{"role": "user", "content": "\\ud83d hi"}]}'
    r = client.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].content"
    raw = b'{"model": "scripted-model", "prompt": ["ok", "\\ud83d"]}'
    r = client.post("/v1/completions", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    raw = b'{"model": "scripted-model", "prompt": "ok", "stop": ["\\udc00"]}'
    r = client.post("/v1/completions", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "stop"
    assert engine.submitted == []
