"""Ollama's native API against the scripted engine: shapes, options, keep_alive, refusals, errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from edge.runtime.text.chat_template import TemplateInfo
from edge.runtime.types import EngineState, GenerationRequest
from tests.fakes import ScriptedEngine, make_app

M = "scripted-model"
CHAT = {"model": M, "messages": [{"role": "user", "content": "hello there"}]}
DURATIONS = ("total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration", "eval_count",
             "eval_duration")


def client_for(engine: ScriptedEngine | None = None, **settings: Any) -> tuple[TestClient, ScriptedEngine]:
    app, eng = make_app(engine, **settings)
    return TestClient(app), eng


def ndjson(raw: bytes) -> list[dict[str, Any]]:
    text = raw.decode()
    assert text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


def assert_final(obj: dict[str, Any], reason: str) -> None:
    assert obj["done"] is True and obj["done_reason"] == reason
    for key in DURATIONS:
        assert isinstance(obj[key], int) and obj[key] >= 0, key
    assert obj["total_duration"] >= obj["prompt_eval_duration"]
    assert obj["created_at"].endswith("Z")


# --- /api/chat ----------------------------------------------------------------------------------


def test_chat_streams_ndjson_by_default() -> None:
    client, _ = client_for()
    r = client.post("/api/chat", json=CHAT)
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/x-ndjson"
    lines = ndjson(r.content)
    assert all(o["model"] == M for o in lines)
    assert [o["message"]["content"] for o in lines[:-1]] == [f"tok{i} " for i in range(8)]
    assert all(o["done"] is False and o["message"]["role"] == "assistant" for o in lines[:-1])
    assert lines[-1]["message"] == {"role": "assistant", "content": ""}
    assert_final(lines[-1], "stop")
    assert lines[-1]["eval_count"] == 8
    assert lines[-1]["prompt_eval_count"] == 4  # "<user> hello there <assistant>"


def test_chat_not_streamed() -> None:
    client, _ = client_for()
    r = client.post("/api/chat", json={**CHAT, "stream": False, "options": {"num_predict": 3}})
    body = r.json()
    assert r.headers["content-type"] == "application/json"
    assert body["message"] == {"role": "assistant", "content": "tok0 tok1 tok2 "}
    assert_final(body, "length")
    assert body["eval_count"] == 3


def test_options_reach_the_engine() -> None:
    client, engine = client_for()
    opts = {"temperature": 0.1, "top_k": 3, "top_p": 0.7, "min_p": 0.2, "seed": 7, "repeat_penalty": 1.2,
            "presence_penalty": 0.3, "frequency_penalty": 0.4, "stop": ["</s>", "###"], "num_predict": 5,
            "num_thread": 8, "mirostat": 1}
    assert client.post("/api/chat", json={**CHAT, "stream": False, "options": opts}).status_code == 200
    req = engine.submitted[-1]
    s = req.sampling
    assert (s.temperature, s.top_k, s.top_p, s.min_p, s.seed) == (0.1, 3, 0.7, 0.2, 7)
    assert (s.repeat_penalty, s.presence_penalty, s.frequency_penalty) == (1.2, 0.3, 0.4)
    assert req.stop == ("</s>", "###") and req.max_tokens == 5


def test_num_ctx_above_the_loaded_context_is_a_clear_400() -> None:
    client, engine = client_for()  # n_ctx 64
    r = client.post("/api/chat", json={**CHAT, "options": {"num_ctx": 4096}})
    assert r.status_code == 400
    assert "num_ctx" in r.json()["error"] and "64" in r.json()["error"]
    assert engine.submitted == []


def test_smaller_num_ctx_bounds_prompt_and_output() -> None:
    client, engine = client_for()
    r = client.post("/api/chat", json={**CHAT, "stream": False, "options": {"num_ctx": 6}})
    assert r.status_code == 200
    assert engine.submitted[-1].max_tokens == 2  # 6 - 4 prompt tokens
    r = client.post("/api/chat", json={**CHAT, "options": {"num_ctx": 4}})
    assert r.status_code == 400 and "context" in r.json()["error"]


def test_format_json_and_schema_use_the_grammar_path() -> None:
    client, engine = client_for()
    client.post("/api/chat", json={**CHAT, "stream": False, "format": "json"})
    assert engine.submitted[-1].sampling.grammar
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    client.post("/api/chat", json={**CHAT, "stream": False, "format": schema})
    assert "root" in (engine.submitted[-1].sampling.grammar or "")
    client.post("/api/chat", json={**CHAT, "stream": False, "format": ""})
    assert engine.submitted[-1].sampling.grammar is None
    bad = {"type": "object", "properties": {"a": {"$ref": "#/nope"}}}
    r = client.post("/api/chat", json={**CHAT, "format": bad})
    assert r.status_code == 400 and r.json()["error"].startswith("format")


@pytest.mark.parametrize(("extra", "field"), [
    ({"think": True}, "thinking"),
    ({"logprobs": True}, "logprobs"),
    ({"messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}, "images"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": [{"function": {"name": "f"}}]}]},
     "tool_calls"),
])
def test_chat_refuses_what_it_cannot_honour(extra: dict[str, Any], field: str) -> None:
    client, engine = client_for()
    r = client.post("/api/chat", json={**CHAT, **extra})
    assert r.status_code == 400 and field in r.json()["error"], r.text
    assert set(r.json()) == {"error"} and engine.submitted == []


def test_chat_without_messages_loads_and_keep_alive_zero_unloads() -> None:
    client, engine = client_for()
    engine.unload()
    r = client.post("/api/chat", json={"model": M, "messages": []})
    assert r.json()["done_reason"] == "load" and r.json()["done"] is True
    assert engine.state is EngineState.READY
    r = client.post("/api/chat", json={"model": M, "keep_alive": 0})
    assert r.json()["done_reason"] == "unload" and engine.state is EngineState.UNLOADED
    assert engine.submitted == []


def test_keep_alive_goes_to_the_engine_after_the_request() -> None:
    client, engine = client_for(keep_alive_s=120.0)
    for ka, want in (("10m", 600.0), (30, 30.0), (-1, None), ("-5m", None), (None, 120.0)):
        body = {**CHAT, "stream": False} if ka is None else {**CHAT, "stream": False, "keep_alive": ka}
        assert client.post("/api/chat", json=body).status_code == 200
        assert engine.keep_alive_calls[-1] == want, ka
    client.post("/api/chat", json={**CHAT, "keep_alive": "0s"})  # streamed: applied when it ends
    assert engine.keep_alive_calls[-1] == 0 and engine.state is EngineState.UNLOADED
    r = client.post("/api/chat", json={**CHAT, "keep_alive": "soon"})
    assert r.status_code == 400 and "keep_alive" in r.json()["error"]


def test_tagged_names_are_accepted_and_unknown_models_are_404() -> None:
    client, _ = client_for()
    assert client.post("/api/chat", json={**CHAT, "model": f"{M}:latest", "stream": False}).status_code == 200
    r = client.post("/api/chat", json={**CHAT, "model": "llama3:8b"})
    assert r.status_code == 404 and "llama3:8b" in r.json()["error"] and set(r.json()) == {"error"}


def test_engine_failure_mid_stream_is_an_error_line() -> None:
    client, _ = client_for(ScriptedEngine(fail_with=RuntimeError("boom")))
    lines = ndjson(client.post("/api/chat", json=CHAT).content)
    assert set(lines[-1]) == {"error"} and "boom" not in lines[-1]["error"]
    r = client.post("/api/chat", json={**CHAT, "stream": False})
    assert r.status_code == 503 and set(r.json()) == {"error"}


# --- /api/generate ------------------------------------------------------------------------------


def test_generate_renders_the_template_and_returns_context() -> None:
    client, engine = client_for()
    r = client.post("/api/generate", json={"model": M, "prompt": "why sky", "system": "be brief",
                                           "stream": False, "options": {"num_predict": 2}})
    body = r.json()
    assert body["response"] == "tok0 tok1 "
    assert_final(body, "length")
    rendered = engine.rendered[-1][0]
    assert rendered == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "why sky"}]
    prompt = engine.submitted[-1].prompt
    assert body["context"] == [*prompt, *engine.tokenize("tok0 tok1 ", False)]
    # the context continues the conversation: its tokens come first in the next prompt
    client.post("/api/generate", json={"model": M, "prompt": "and", "context": body["context"],
                                       "stream": False})
    assert engine.submitted[-1].prompt[: len(body["context"])] == body["context"]


def test_generate_stream_lines() -> None:
    client, _ = client_for()
    lines = ndjson(client.post("/api/generate", json={"model": M, "prompt": "hi"}).content)
    assert "".join(o["response"] for o in lines) == "".join(f"tok{i} " for i in range(8))
    assert_final(lines[-1], "stop")
    assert lines[-1]["response"] == "" and isinstance(lines[-1]["context"], list)


def test_raw_and_trivial_template_send_the_prompt_as_is() -> None:
    client, engine = client_for()
    for extra in ({"raw": True}, {"template": "{{ .Prompt }}"}):
        n = len(engine.rendered)
        client.post("/api/generate", json={"model": M, "prompt": "a b c", "stream": False, **extra})
        assert len(engine.rendered) == n  # no chat template
        assert engine.submitted[-1].prompt == engine.tokenize("a b c", True)


def test_base_model_generate_uses_the_prompt_verbatim() -> None:
    fallback = TemplateInfo("fallback", "plain", tools=False, tool_format=None)
    client, engine = client_for(ScriptedEngine(template_info=fallback))
    client.post("/api/generate", json={"model": M, "prompt": "once upon", "stream": False})
    assert engine.rendered == [] and engine.submitted[-1].prompt == engine.tokenize("once upon", True)


@pytest.mark.parametrize(("extra", "field"), [
    ({"raw": True, "system": "s"}, "system"),
    ({"template": "{{ .System }} {{ .Prompt }}"}, "template"),
    ({"suffix": "return x"}, "suffix"),
    ({"images": ["aGk="]}, "images"),
    ({"think": "high"}, "thinking"),
    ({"context": [True]}, "context"),
])
def test_generate_refusals(extra: dict[str, Any], field: str) -> None:
    client, engine = client_for()
    r = client.post("/api/generate", json={"model": M, "prompt": "p", **extra})
    assert r.status_code == 400 and field in r.json()["error"], r.text
    assert engine.submitted == []


def test_empty_generate_loads_and_unloads() -> None:
    client, engine = client_for()
    engine.unload()
    assert client.post("/api/generate", json={"model": M}).json()["done_reason"] == "load"
    assert engine.state is EngineState.READY
    r = client.post("/api/generate", json={"model": M, "keep_alive": 0})
    assert r.json() == {**r.json(), "response": "", "done": True, "done_reason": "unload"}
    assert engine.state is EngineState.UNLOADED and engine.submitted == []


# --- errors in Ollama's shape -------------------------------------------------------------------


def test_validation_and_routing_errors_are_ollama_shaped() -> None:
    client, _ = client_for()
    cases = [
        client.post("/api/chat", json={"model": 3}),
        client.post("/api/chat", json=[1, 2]),
        client.post("/api/chat", content=b"{nope", headers={"content-type": "application/json"}),
        client.post("/api/chat", json={"model": M, "messages": [{"role": "wizard", "content": "x"}]}),
        client.post("/api/generate", json={"model": M, "prompt": "p", "options": {"num_predict": "lots"}}),
        client.get("/api/nothing"),
        client.get("/api/chat"),
        client.post("/api/chat", json={"model": M, "messages": "hi"}),
    ]
    for r in cases:
        assert 400 <= r.status_code < 500, r.text
        body = r.json()
        assert set(body) == {"error"} and isinstance(body["error"], str), body
    assert [r.status_code for r in cases[-3:]] == [404, 405, 400]


def test_v1_errors_keep_the_openai_shape() -> None:
    client, _ = client_for()
    body = client.post("/v1/chat/completions", json={"model": 3}).json()
    assert isinstance(body["error"], dict) and body["error"]["type"] == "invalid_request_error"


def test_auth_applies_to_api_routes_in_ollama_shape() -> None:
    client, _ = client_for(api_key="sekrit")
    r = client.get("/api/tags")
    assert r.status_code == 401 and set(r.json()) == {"error"}
    r = client.get("/api/tags", headers={"Authorization": "Bearer sekrit"})
    assert r.status_code == 200


def test_content_type_rule_for_browsers_only() -> None:
    client, _ = client_for()
    raw = json.dumps({**CHAT, "stream": False})
    # Ollama's documented `curl -d` sends a form type and no Origin: accepted
    r = client.post("/api/chat", content=raw, headers={"content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 200
    # a web page (Origin set) must use application/json, which forces a CORS preflight
    r = client.post("/api/chat", content=raw, headers={"content-type": "text/plain", "origin": "http://evil.example"})
    assert r.status_code == 415 and set(r.json()) == {"error"}


def test_openapi_lists_the_ollama_routes_with_their_error_shape() -> None:
    client, _ = client_for()
    doc = client.get("/openapi.json").json()
    routes = {"/api/chat": "post", "/api/generate": "post", "/api/embed": "post", "/api/embeddings": "post",
              "/api/show": "post", "/api/pull": "post", "/api/delete": "delete", "/api/tags": "get",
              "/api/ps": "get", "/api/version": "get"}
    for path, method in routes.items():
        op = doc["paths"][path][method]
        ref404 = op["responses"]["404"]["content"]["application/json"]["schema"]["$ref"]
        assert ref404.endswith("/OllamaError")
        if method != "get":
            ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
            assert ref.split("/")[-1] in doc["components"]["schemas"]
    schemas = doc["components"]["schemas"]
    assert "options" in schemas["OllamaChatRequest"]["properties"]
    assert doc["paths"]["/v1/chat/completions"]["post"]["responses"]["400"]["content"]["application/json"][
        "schema"]["$ref"].endswith("/Error")


def _script_echo(request: GenerationRequest) -> list[str]:
    return ["ok"]


def test_unknown_fields_are_ignored(tmp_path: Path) -> None:
    client, _ = client_for(ScriptedEngine(script=_script_echo))
    r = client.post("/api/chat", json={**CHAT, "stream": False, "shift": True, "truncate": True})
    assert r.status_code == 200 and r.json()["message"]["content"] == "ok"
