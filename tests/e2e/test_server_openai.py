"""The live server with the real SmolLM2: official openai SDK, raw SSE, concurrency, cancel, metrics.

One server for the module: 4 slots, notify socket with a 2 s watchdog.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import REPO, LiveServer, cli_cmd, launch

pytestmark = [pytest.mark.e2e, pytest.mark.model]
MESSAGES = [{"role": "user", "content": "Write a short story about a robot."}]


@pytest.fixture(scope="module")
def server(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    s = launch(
        tmp_path_factory.mktemp("shared"),
        smollm2_path,
        "--slots",
        "4",
        "--ctx",
        "2048",
        "--max-queue",
        "8",
        "--no-scheduler",
        "--threads",
        "1",
        notify=True,
    )
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _model(server: LiveServer) -> str:
    return httpx.get(server.url + "/v1/models").json()["data"][0]["id"]


def test_sdk_chat_non_streaming(server: LiveServer, client: openai.OpenAI, smollm2_path: Path) -> None:
    r = client.chat.completions.create(
        model=_model(server), messages=MESSAGES, max_tokens=12, temperature=0, seed=1
    )
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content
    assert r.choices[0].finish_reason in ("stop", "length")
    assert 0 < r.usage.completion_tokens <= 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    # the file name works as the model name too
    r2 = client.chat.completions.create(
        model=smollm2_path.name, messages=MESSAGES, max_tokens=12, temperature=0
    )
    assert r2.choices[0].message.content == r.choices[0].message.content  # greedy is deterministic
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4o", messages=MESSAGES, max_tokens=4)


def test_sdk_chat_streaming_with_usage(server: LiveServer, client: openai.OpenAI) -> None:
    model = _model(server)
    full = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=16, temperature=0)
    stream = client.chat.completions.create(
        model=model,
        messages=MESSAGES,
        max_tokens=16,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, finish, usage = "", None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            text += c.delta.content or ""
            finish = c.finish_reason or finish
    assert text == full.choices[0].message.content
    assert finish == full.choices[0].finish_reason
    assert usage is not None and usage.completion_tokens == full.usage.completion_tokens
    assert usage.prompt_tokens == full.usage.prompt_tokens


def test_sdk_completions(server: LiveServer, client: openai.OpenAI) -> None:
    model = _model(server)
    r = client.completions.create(model=model, prompt="The capital of France is", max_tokens=8, temperature=0)
    assert r.choices[0].text and r.usage.completion_tokens <= 8
    chunks = list(
        client.completions.create(
            model=model, prompt="The capital of France is", max_tokens=8, temperature=0, stream=True
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == r.choices[0].text


def test_raw_sse_framing(server: LiveServer) -> None:
    body = {"model": _model(server), "messages": MESSAGES, "max_tokens": 6, "stream": True}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    blocks = raw.split("\n\n")
    assert blocks[-1] == "" and blocks[-2] == "data: [DONE]"
    chunks = [json.loads(b[len("data: ") :]) for b in blocks[:-2]]
    assert all(b.startswith("data: {") for b in blocks[:-2])
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])


def test_four_concurrent_streams_complete_with_usage(server: LiveServer) -> None:
    model = _model(server)
    prompts = [f"Count from {i} to {i + 20}." for i in range(4)]
    results: list[dict] = [{} for _ in prompts]

    def worker(i: int) -> None:
        c = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)
        stream = c.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": prompts[i]}],
            max_tokens=24,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        n_chunks, text = 0, ""
        for chunk in stream:
            if chunk.usage is not None:
                results[i]["usage"] = chunk.usage
            for ch in chunk.choices:
                if ch.delta.content:
                    n_chunks += 1
                    text += ch.delta.content
                if ch.finish_reason:
                    results[i]["finish"] = ch.finish_reason
        results[i].update(text=text, n_chunks=n_chunks)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    for i, res in enumerate(results):
        assert res.get("text"), f"stream {i} got no tokens"
        u = res["usage"]
        assert res["finish"] in ("stop", "length")
        if res["finish"] == "length":
            assert u.completion_tokens == 24
        assert u.completion_tokens >= res["n_chunks"] > 0
        single = httpx.post(
            server.url + "/v1/chat/completions",
            timeout=120,
            json={
                "model": model,
                "messages": [{"role": "user", "content": prompts[i]}],
                "max_tokens": 24,
                "temperature": 0,
            },
        ).json()
        assert single["usage"]["prompt_tokens"] == u.prompt_tokens
        # batched and single decoding may differ numerically, so only the bound is compared
        assert 0 < single["usage"]["completion_tokens"] <= 24


def _status(server: LiveServer) -> dict:
    return httpx.get(server.url + "/v1/status", timeout=10).json()


def test_disconnect_mid_stream_frees_the_slot(server: LiveServer) -> None:
    # EOS tokens banned so the generation cannot end by itself
    body = {
        "model": _model(server),
        "messages": MESSAGES,
        "max_tokens": 1500,
        "stream": True,
        "logit_bias": {"0": -100, "1": -100, "2": -100},
    }
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as r:
        seen = 0
        lines = r.iter_lines()  # kept referenced: a dropped iterator closes the connection
        for line in lines:
            if line.startswith("data: {"):
                seen += 1
            if seen >= 4:
                break
        during = _status(server)
        assert during["server"]["in_flight"] == 1
        assert during["slots"]["active"] + during["slots"]["waiting"] == 1
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        s = _status(server)
        if s["slots"]["active"] == 0 and s["server"]["in_flight"] == 0:
            break
        time.sleep(0.05)
    assert s["slots"]["active"] == 0 and s["server"]["in_flight"] == 0
    assert s["engine"]["total_tokens_decoded"] < 1500  # it really stopped


def test_metrics_parse(server: LiveServer) -> None:
    httpx.post(
        server.url + "/v1/completions",
        json={"model": _model(server), "prompt": "Hi", "max_tokens": 3},
        timeout=60,
    )
    fams = {f.name: f for f in text_string_to_metric_families(httpx.get(server.url + "/metrics").text)}
    for name in (
        "edge_requests",
        "edge_prompt_tokens",
        "edge_generated_tokens",
        "edge_ttft_seconds",
        "edge_token_latency_seconds",
        "edge_queue_depth",
        "edge_active_slots",
        "edge_kv_cells_used",
        "edge_engine_step_seconds",
    ):
        assert name in fams, name
    ok = [
        s
        for s in fams["edge_requests"].samples
        if s.labels.get("endpoint") == "/v1/completions" and s.labels.get("status") == "200"
    ]
    assert ok and ok[0].value >= 1
    assert next(s.value for s in fams["edge_generated_tokens"].samples if s.name.endswith("_total")) >= 3
    assert next(s.value for s in fams["edge_slots"].samples) == 4


def test_notify_ready_and_watchdog(server: LiveServer) -> None:
    msgs = server.read_notify("READY=1")
    assert any(m.startswith("READY=1") for m in msgs)
    msgs = server.read_notify("WATCHDOG=1", timeout_s=5)
    assert "WATCHDOG=1" in msgs


def test_cli_status_and_chat_against_server(server: LiveServer) -> None:
    res = subprocess.run(
        cli_cmd("status", "--url", server.url), capture_output=True, text=True, cwd=REPO, timeout=60
    )
    assert res.returncode == 0, res.stderr
    assert "0/4 active" in res.stdout and "in flight 0" in res.stdout
    res = subprocess.run(
        cli_cmd("chat", "--url", server.url, "-n", "8", "--temperature", "0"),
        input="Hello\n/exit\n",
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.count(">>> ") == 2 and len(res.stdout.replace(">>> ", "").strip()) > 0
