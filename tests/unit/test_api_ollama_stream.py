"""Ollama's API, the parts that need a hand-driven engine: disconnects, overload, streamed tool calls."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fastapi.testclient import TestClient

from edge.runtime.text.chat_template import TemplateInfo
from edge.runtime.types import FinishReason, GenerationRequest
from tests.fakes import AsgiCall, ScriptedEngine, make_app, settle

M = "scripted-model"
CHAT = {"model": M, "messages": [{"role": "user", "content": "hello there"}]}
HERMES = TemplateInfo("model", None, tools=True, tool_format="hermes")
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "%s"}}\n</tool_call>'


def lines_of(raw: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in raw.decode().splitlines() if line]


def test_stream_disconnect_cancels_and_frees_the_slot() -> None:
    async def main() -> None:
        app, engine = make_app(ScriptedEngine(n_slots=1, autostep=False))
        call = AsgiCall(app, "POST", "/api/chat", {**CHAT, "options": {"num_predict": 8}})
        task = asyncio.create_task(call.run())
        await settle()
        engine.step(2)
        await settle()
        assert b"tok1" in call.body_bytes
        handle = engine.active[0]
        call.disconnect()
        await settle()
        await asyncio.wait_for(task, 1.0)
        assert handle.cancel_requested and app.state.edge.in_flight == {}
        engine.step()
        assert engine.active == [] and handle.finish_reason is FinishReason.CANCELLED
        assert handle.emitted == 2
        assert app.state.edge.admission.status()["in_flight"] == 0  # the ticket is released

    asyncio.run(main())


def test_disconnect_while_waiting_for_a_slot_never_takes_it() -> None:
    async def main() -> None:
        app, engine = make_app(ScriptedEngine(n_slots=1, autostep=False))
        busy = AsgiCall(app, "POST", "/api/generate", {"model": M, "prompt": "a", "stream": False,
                                                        "options": {"num_predict": 3}})
        waiting = AsgiCall(app, "POST", "/api/generate", {"model": M, "prompt": "b"})
        tb, tw = asyncio.create_task(busy.run()), asyncio.create_task(waiting.run())
        await settle()
        engine.step()
        await settle()
        assert len(engine.waiting) == 1 and waiting.body_bytes == b""
        waiting.disconnect()
        await settle()
        await asyncio.wait_for(tw, 1.0)
        engine.step()
        assert engine.waiting == []
        engine.step(3)
        await settle()
        await tb
        assert busy.status == 200

    asyncio.run(main())


def test_non_streamed_disconnect_cancels() -> None:
    async def main() -> None:
        app, engine = make_app(ScriptedEngine(n_slots=1, autostep=False))
        call = AsgiCall(app, "POST", "/api/chat", {**CHAT, "stream": False})
        task = asyncio.create_task(call.run())
        await settle()
        engine.step()
        await settle()
        handle = engine.active[0]
        call.disconnect()
        await settle()
        await asyncio.wait_for(task, 1.0)
        assert handle.cancel_requested
        engine.step()
        assert engine.active == [] and app.state.edge.in_flight == {}

    asyncio.run(main())


def test_overload_is_503_with_retry_after_in_ollama_shape() -> None:
    async def main() -> None:
        app, engine = make_app(ScriptedEngine(n_slots=1, autostep=False), max_queue=0)
        running = AsgiCall(app, "POST", "/api/chat", CHAT)
        task = asyncio.create_task(running.run())
        await settle()
        gen = {"model": M, "prompt": "x", "stream": False}
        for path, body in (("/api/chat", CHAT), ("/api/generate", gen)):
            refused = AsgiCall(app, "POST", path, body)
            await refused.run()
            assert refused.status == 503 and refused.header("retry-after") == "1"
            err = json.loads(refused.body_bytes)
            assert set(err) == {"error"} and isinstance(err["error"], str)
        assert len(engine.submitted) == 1
        engine.step(10)
        await settle()
        await task
        assert running.status == 200 and lines_of(running.body_bytes)[-1]["done"] is True

    asyncio.run(main())


def _tool_engine(output: str, **kw: Any) -> tuple[Any, ScriptedEngine]:
    def script(_: GenerationRequest) -> list[str]:
        return [output[i:i + 4] for i in range(0, len(output), 4)]

    return make_app(ScriptedEngine(script=script, template_info=HERMES, n_ctx=512, **kw))


def test_tool_calls_stream_as_each_completes() -> None:
    async def main() -> None:
        output = "Let me check." + CALL % "Paris" + CALL % "Oslo"
        app, engine = _tool_engine(output, autostep=False)
        call = AsgiCall(app, "POST", "/api/chat", {**CHAT, "tools": [WEATHER]})
        task = asyncio.create_task(call.run())
        await settle()
        first_call_end = (len("Let me check.") + len(CALL % "Paris") + 3) // 4
        engine.step(first_call_end)
        await settle()
        seen = lines_of(call.body_bytes)
        calls = [c for o in seen for c in o["message"].get("tool_calls", [])]
        assert [c["function"]["arguments"] for c in calls] == [{"city": "Paris"}]  # before the end
        assert not any(o["done"] for o in seen)
        engine.step(100)
        await settle()
        await task
        lines = lines_of(call.body_bytes)
        calls = [c for o in lines for c in o["message"].get("tool_calls", [])]
        assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == [
            ("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Oslo"})]
        assert "".join(o["message"]["content"] for o in lines) == "Let me check."
        assert lines[-1]["done"] is True and lines[-1]["done_reason"] == "stop"
        assert engine.rendered[-1][1][0]["function"]["name"] == "get_weather"  # tools reached the template

    asyncio.run(main())


def test_tool_calls_not_streamed() -> None:
    app, _ = _tool_engine(CALL % "Paris")
    r = TestClient(app).post("/api/chat", json={**CHAT, "tools": [WEATHER], "stream": False})
    msg = r.json()["message"]
    assert msg["content"] == ""
    want = {"index": 0, "name": "get_weather", "arguments": {"city": "Paris"}}
    assert msg["tool_calls"][0]["function"] == want


def test_tool_history_in_ollama_shape_reaches_the_template() -> None:
    app, engine = _tool_engine("It is sunny.")
    history = [
        {"role": "user", "content": "weather in Paris and Oslo?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
            {"function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
        {"role": "tool", "content": "sunny", "tool_name": "get_weather"},
        {"role": "tool", "content": "snow"},
    ]
    r = TestClient(app).post("/api/chat", json={"model": M, "messages": history, "tools": [WEATHER],
                                                "stream": False})
    assert r.status_code == 200 and r.json()["message"]["content"] == "It is sunny."
    rendered = engine.rendered[-1][0]
    calls = rendered[1]["tool_calls"]
    assert [c["function"]["arguments"] for c in calls] == [{"city": "Paris"}, {"city": "Oslo"}]
    assert [m["tool_call_id"] for m in rendered[2:]] == [calls[0]["id"], calls[1]["id"]]  # answered in order
    assert rendered[2]["name"] == rendered[3]["name"] == "get_weather"


def test_tools_need_a_tool_template_and_exclude_format() -> None:
    plain = TemplateInfo("model", None, tools=False, tool_format=None)
    app, _ = make_app(ScriptedEngine(template_info=plain))
    client = TestClient(app)
    r = client.post("/api/chat", json={**CHAT, "tools": [WEATHER]})
    assert r.status_code == 400 and "tool" in r.json()["error"]
    app, _ = _tool_engine("x")
    r = TestClient(app).post("/api/chat", json={**CHAT, "tools": [WEATHER], "format": "json"})
    assert r.status_code == 400 and "format" in r.json()["error"]
