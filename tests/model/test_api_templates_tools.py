"""The chat API on real models, in process: tool-call grammars compile in llama.cpp and constrain
the output; a base model's fallback template stops at its own turn markers."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from edge.api.app import create_app
from edge.config import Settings
from edge.runtime import Engine, EngineConfig
from edge.runtime.text.chat_template import resolve_chat_template

pytestmark = pytest.mark.model

UNITS = ["celsius", "fahrenheit"]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 40}, "unit": {"type": "string", "enum": UNITS},
        "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "unit", "days"], "additionalProperties": False}}}
ADD = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"]}}}


def _client(engine: Engine) -> TestClient:
    return TestClient(create_app(Settings(), engine, api_key="", model_id="x"))


@pytest.fixture(scope="module")
def smol_tools(smollm2_path: Path) -> Iterator[TestClient]:
    """SmolLM2 has plain ChatML without tools; the built-in chatml-tools template adds them."""
    tools = resolve_chat_template("chatml-tools")
    config = EngineConfig(smollm2_path, n_ctx=1024, n_slots=1, n_threads=2, chat_template=tools)
    with Engine(config) as engine:
        yield _client(engine)


def test_named_tool_grammar_constrains_a_model_that_never_saw_tools(smol_tools: TestClient) -> None:
    card = smol_tools.get("/v1/models").json()["data"][0]
    assert card["chat_template"]["source"] == "name" and card["chat_template"]["tool_format"] == "hermes"
    r = smol_tools.post("/v1/chat/completions", json={
        "model": "x", "messages": [{"role": "user", "content": "Weather in Lisbon for 3 days?"}],
        "tools": [WEATHER, ADD], "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "temperature": 0, "max_tokens": 60})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    [call] = choice["message"]["tool_calls"]
    args = json.loads(call["function"]["arguments"])
    assert call["function"]["name"] == "get_weather"
    assert set(args) == {"city", "unit", "days"} and args["unit"] in UNITS
    assert isinstance(args["days"], int) and 1 <= args["days"] <= 7 and isinstance(args["city"], str)


def test_required_picks_one_of_the_tools_with_valid_arguments(smol_tools: TestClient) -> None:
    r = smol_tools.post("/v1/chat/completions", json={
        "model": "x", "messages": [{"role": "user", "content": "What is 2 plus 40?"}],
        "tools": [WEATHER, ADD], "tool_choice": "required", "temperature": 0, "max_tokens": 60})
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    call = choice["message"]["tool_calls"][0]["function"]
    args = json.loads(call["arguments"])
    if call["name"] == "add":
        assert isinstance(args["a"], int) and isinstance(args["b"], int)
    else:
        assert call["name"] == "get_weather" and args["unit"] in UNITS


def test_base_model_fallback_stops_at_its_turn_markers(gemma_path: Path) -> None:
    with Engine(EngineConfig(gemma_path, n_ctx=512, n_slots=1, n_threads=2, n_batch=128)) as engine:
        client = _client(engine)
        card = client.get("/v1/models").json()["data"][0]
        assert card["chat_template"]["source"] == "fallback" and card["chat_template"]["name"] == "plain"
        r = client.post("/v1/chat/completions", json={
            "model": "x", "temperature": 0, "max_tokens": 64,
            "messages": [{"role": "user", "content": "What is the capital of France?"}]})
        choice = r.json()["choices"][0]
        text = choice["message"]["content"]
        assert text.strip()
        for marker in ("User:", "Assistant:", "System:"):
            assert f"\n{marker}" not in text, text
        # without the markers as stops the same request ran on into a made-up next turn
        prompt = engine.render_chat([{"role": "user", "content": "What is the capital of France?"}])
        raw = engine.complete(prompt, temperature=0.0, max_tokens=64, add_bos=False)
        assert choice["finish_reason"] == "stop" or "\nUser:" not in raw.text
        if "\nUser:" in raw.text:
            assert text.strip() == raw.text.split("\nUser:")[0].strip()
