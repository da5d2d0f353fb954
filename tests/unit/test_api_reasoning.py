"""Thinking on the HTTP side (api/reasoning.py) against the scripted engine: what reaches the
template (`enable_thinking`, efforts), the request's `ReasoningSpec` and budget, the 400s, the
Responses reasoning item and the status; the split itself is the engine's (tests/model)."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from edge.api.reasoning import ThinkAsk, ask_ollama, ask_openai, ask_responses
from edge.api.responses_output import OutputBuilder
from edge.runtime.text.chat_template import TemplateInfo
from edge.runtime.text.reasoning import THINK
from edge.scheduler.reasoning import ThinkingBudget
from tests.fakes import ScriptedEngine, make_app

M = "scripted-model"
ASK = [{"role": "user", "content": "hello there"}]
THINKING = TemplateInfo("file", "think.jinja", False, None, thinking="think")
PLAIN = TemplateInfo("model", None, False, None)


def client_for(info: TemplateInfo | None, **settings: Any) -> tuple[TestClient, ScriptedEngine]:
    app, engine = make_app(ScriptedEngine(n_ctx=256, template_info=info), **settings)
    return TestClient(app), engine


def chat(client: TestClient, **extra: Any) -> Any:
    return client.post("/v1/chat/completions", json={"model": M, "messages": ASK, "max_tokens": 4, **extra})


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/api/chat", {"messages": ASK, "think": True}, "think"),
    ("/api/chat", {"messages": ASK, "think": "high"}, "think"),
    ("/api/generate", {"prompt": "hi", "think": True}, "think"),
    ("/v1/chat/completions", {"messages": ASK, "reasoning_effort": "high"}, "reasoning_effort"),
    ("/v1/chat/completions", {"messages": ASK, "chat_template_kwargs": {"enable_thinking": True}},
     "chat_template_kwargs.enable_thinking"),
    ("/v1/responses", {"input": "hi", "reasoning": {"effort": "medium"}}, "reasoning.effort"),
])
def test_a_model_that_cannot_think_is_a_400_naming_the_field(path: str, body: dict[str, Any],
                                                             param: str) -> None:
    client, engine = client_for(PLAIN)
    r = client.post(path, json={"model": M, **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["param"] == param) if isinstance(err, dict) else ("thinking" in err)
    assert engine.submitted == []


@pytest.mark.parametrize("body", [{"think": False}, {"reasoning_effort": "none"},
                                  {"chat_template_kwargs": {"enable_thinking": False}}])
def test_asking_for_no_thinking_is_fine_anywhere(body: dict[str, Any]) -> None:
    client, engine = client_for(PLAIN)
    path = "/api/chat" if "think" in body else "/v1/chat/completions"
    r = client.post(path, json={"model": M, "messages": ASK, "stream": False, **body})
    assert r.status_code == 200, r.text
    assert engine.submitted[-1].reasoning is None  # no think family, format auto: nothing to split


@pytest.mark.parametrize(("budget", "ok"), [(-1, False), (0, True), (256, True), (257, False)])
def test_a_budget_outside_zero_to_the_context_is_a_400(budget: int, ok: bool) -> None:
    client, _ = client_for(THINKING)
    r = chat(client, reasoning_budget=budget)
    assert (r.status_code == 200) is ok, r.text
    if not ok:
        assert r.json()["error"]["param"] == "reasoning_budget"
    o = client.post("/api/chat", json={"model": M, "messages": ASK, "stream": False,
                                       "options": {"reasoning_budget": budget}})
    assert (o.status_code == 200) is ok and (ok or "reasoning_budget" in o.json()["error"])


def test_thinking_switches_reach_the_template_and_the_engine_request() -> None:
    client, engine = client_for(THINKING)
    assert chat(client).status_code == 200
    assert engine.template_kwargs[-1] is None  # nothing asked: the template's default
    spec = engine.submitted[-1].reasoning
    assert spec is not None and spec.markers is THINK and spec.budget_tokens is None and not spec.started
    chat(client, reasoning_effort="low")
    assert engine.template_kwargs[-1] == {"enable_thinking": True, "reasoning_effort": "low"}
    chat(client, chat_template_kwargs={"enable_thinking": False, "custom": 1})
    assert engine.template_kwargs[-1] == {"enable_thinking": False, "custom": 1}
    chat(client, reasoning_budget=0)  # llama-server: a budget of 0 turns thinking off
    assert engine.template_kwargs[-1] == {"enable_thinking": False}
    assert engine.submitted[-1].reasoning.budget_tokens == 0  # type: ignore[union-attr]
    client.post("/api/chat", json={"model": M, "messages": ASK, "think": "medium", "stream": False})
    assert engine.template_kwargs[-1] == {"enable_thinking": True, "reasoning_effort": "medium"}
    client.post("/v1/responses", json={"model": M, "input": "hi", "reasoning": {"effort": "minimal"}})
    assert engine.template_kwargs[-1] == {"enable_thinking": False}


def test_format_setting_and_per_request_format_and_grammar() -> None:
    client, engine = client_for(THINKING, reasoning_format="none")
    chat(client)
    assert engine.submitted[-1].reasoning is None  # none: the text as the model wrote it
    chat(client, reasoning_format="deepseek-legacy")
    assert engine.submitted[-1].reasoning.keep_markers  # type: ignore[union-attr]
    assert chat(client, reasoning_format="bogus").json()["error"]["param"] == "reasoning_format"
    client, engine = client_for(THINKING)
    chat(client, response_format={"type": "json_object"})
    assert engine.submitted[-1].reasoning is None  # a grammar leaves no room for a think block


def test_the_budget_in_force_caps_the_request() -> None:
    class Sched:  # what the API asks of a scheduler here
        admission = None

        def reasoning_budget(self, base: int | None) -> ThinkingBudget:
            return ThinkingBudget(100, base, 0.25, ("battery 10% under its reserve",))

        def status(self) -> dict[str, Any]:
            return {}

        def limits(self) -> tuple[()]:
            return ()

    client, engine = client_for(THINKING, reasoning_budget=400)
    st = client.app.state.edge  # type: ignore[attr-defined]
    st.scheduler = Sched()
    chat(client, reasoning_budget=200)
    assert engine.submitted[-1].reasoning.budget_tokens == 100  # type: ignore[union-attr]
    chat(client, reasoning_budget=50)
    assert engine.submitted[-1].reasoning.budget_tokens == 50  # type: ignore[union-attr]
    status = client.get("/v1/status").json()["reasoning"]
    assert status["format"] == "auto" and status["budget"]["tokens"] == 100
    assert "battery" in status["budget"]["reason"]


def test_ask_parsing() -> None:
    assert ask_ollama("m", "low", 5) == ThinkAsk("m", True, "think", "low", 5, "options.reasoning_budget")
    assert ask_ollama("m", None, None).enable is None and ask_ollama("m", False, None).enable is False
    assert ask_responses("m", "none", {}).enable is False and ask_responses("m", "high", {}).enable
    a = ask_openai("m", {"reasoning_effort": "none", "chat_template_kwargs": {"enable_thinking": True}})
    assert a.enable is False and a.param == "reasoning_effort"  # the effort wins
    for bad, param in (({"reasoning_effort": "max"}, "reasoning_effort"),
                       ({"chat_template_kwargs": []}, "chat_template_kwargs"),
                       ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs.messages"),
                       ({"reasoning_budget": True}, "reasoning_budget")):
        with pytest.raises(Exception) as err:
            ask_openai("m", bad)
        assert err.value.param == param  # type: ignore[attr-defined]


def test_responses_reasoning_item_comes_first_and_closes_before_the_message() -> None:
    b = OutputBuilder()
    events = b.reasoning("Let me") + b.reasoning(" see.") + b.text("Hi") + b.finish(False)
    kinds = [e["type"] for e in events]
    assert kinds[:3] == ["response.output_item.added", "response.reasoning_text.delta",
                         "response.reasoning_text.delta"]
    assert kinds[3:5] == ["response.reasoning_text.done", "response.output_item.done"]
    assert b.output[0]["type"] == "reasoning" and b.output[0]["content"][0]["text"] == "Let me see."
    assert b.output[1]["type"] == "message" and b.output[1]["content"][0]["text"] == "Hi"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert b.conversation_items()[0] == {"type": "reasoning", "id": b.output[0]["id"], "summary": []}
    cut = OutputBuilder()
    cut.reasoning("never closed")
    cut.finish(True)
    assert cut.output[0]["status"] == "incomplete"
