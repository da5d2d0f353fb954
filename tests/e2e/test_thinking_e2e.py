"""Thinking on a live `edge serve`, through real clients unmodified: the `ollama` package
(`think=True`, streamed and not) gets `thinking` and `content` apart, the OpenAI SDK reads
`reasoning_content` and gets a Responses reasoning item, LangChain's ChatOllama with
`reasoning=True`; /v1/status shows the thinking budget in force. The model is SmolLM2 with the
shipped ChatML think template (no catalog model thinks on its own)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import ollama
import openai
import pytest

from tests.e2e.conftest import REPO, LiveServer, launch

pytestmark = [pytest.mark.e2e, pytest.mark.model]
TEMPLATE = REPO / "configs" / "templates" / "chatml-think.jinja"
ASK = [{"role": "user", "content": "What is 12 times 7? Explain step by step."}]
BUDGET = 16
OPTIONS = {"temperature": 0, "seed": 1, "num_predict": 60}


@pytest.fixture(scope="module")
def server(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    s = launch(tmp_path_factory.mktemp("thinking"), smollm2_path, "--chat-template", str(TEMPLATE),
               "--reasoning-budget", str(BUDGET), "--slots", "1", "--ctx", "1024", "--no-scheduler",
               "--threads", "1")
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def name(server: LiveServer) -> str:
    return str(ollama.Client(host=server.url).list().models[0].model)


def test_ollama_think_streamed_and_not(server: LiveServer, name: str) -> None:
    client = ollama.Client(host=server.url, timeout=300)
    whole = client.chat(model=name, messages=ASK, think=True, options=OPTIONS)
    assert whole.message.thinking and whole.message.thinking.strip()
    assert whole.message.content and "think>" not in whole.message.thinking
    parts = list(client.chat(model=name, messages=ASK, think=True, options=OPTIONS, stream=True))
    assert "".join(p.message.thinking or "" for p in parts) == whole.message.thinking
    assert "".join(p.message.content or "" for p in parts) == whole.message.content
    first_content = next(i for i, p in enumerate(parts) if p.message.content)
    assert all(not p.message.thinking for p in parts[first_content:])  # thinking comes first
    plain = client.chat(model=name, messages=ASK, think=False, options=OPTIONS)
    assert not plain.message.thinking and plain.message.content
    gen = client.generate(model=name, prompt=ASK[0]["content"], think=True, options=OPTIONS)
    assert gen.thinking and gen.response


def test_openai_sdk_reads_reasoning_content_and_a_reasoning_item(server: LiveServer, name: str) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)
    r = client.chat.completions.create(model=name, messages=ASK, reasoning_effort="high", temperature=0,
                                       max_tokens=60)  # type: ignore[arg-type]
    msg = r.choices[0].message
    reasoning = (msg.model_extra or {}).get("reasoning_content")
    assert reasoning and reasoning.strip() and msg.content
    assert r.usage is not None and r.usage.completion_tokens_details is not None
    n_close = 5  # "\n</think>\n\n" in SmolLM2's vocabulary
    assert 0 < (r.usage.completion_tokens_details.reasoning_tokens or 0) <= BUDGET + n_close
    stream = client.chat.completions.create(model=name, messages=ASK, reasoning_effort="high", temperature=0,
                                            max_tokens=60, stream=True)  # type: ignore[arg-type]
    deltas = [c.choices[0].delta for c in stream if c.choices]
    assert "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas) == reasoning
    assert "".join(d.content or "" for d in deltas) == msg.content
    resp = client.responses.create(model=name, input=ASK[0]["content"], reasoning={"effort": "high"},
                                   temperature=0, max_output_tokens=60)
    assert resp.output[0].type == "reasoning" and resp.output_text.strip()
    item = resp.output[0]
    assert item.content and item.content[0].text.strip()  # type: ignore[union-attr]
    assert resp.usage is not None and resp.usage.output_tokens_details.reasoning_tokens > 0


def test_langchain_chat_ollama_reasoning(server: LiveServer, name: str) -> None:
    from langchain_ollama import ChatOllama

    llm = ChatOllama(model=name, base_url=server.url, temperature=0, num_predict=60, seed=1, reasoning=True)
    out = llm.invoke(ASK[0]["content"])
    assert out.additional_kwargs.get("reasoning_content") and isinstance(out.content, str) and out.content


def test_status_shows_the_budget_in_force(server: LiveServer) -> None:
    status = httpx.get(server.url + "/v1/status", timeout=10).json()["reasoning"]
    assert status["format"] == "auto"
    assert status["budget"]["tokens"] == BUDGET and status["budget"]["reason"] == "no cut in force"
    card = httpx.get(server.url + "/v1/models", timeout=10).json()["data"][0]
    assert card["chat_template"]["thinking"] == "think"
    shown = ollama.Client(host=server.url).show(card["id"])
    assert shown.capabilities is not None and "thinking" in shown.capabilities
