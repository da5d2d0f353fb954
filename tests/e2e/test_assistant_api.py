"""The API an offline assistant needs, on a live server with the real SmolLM2: embeddings and
logprobs through the official SDK, the queue bound as a user meets it, keep-alive pings."""

from __future__ import annotations

import base64
import concurrent.futures
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

from tests.e2e.conftest import LiveServer, launch

pytestmark = [pytest.mark.e2e, pytest.mark.model]


@pytest.fixture(scope="module")
def server(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    s = launch(tmp_path_factory.mktemp("assistant"), smollm2_path, "--slots", "2", "--max-queue", "2",
               "--ctx", "2048", "--threads", "2", env={"EDGE_SSE_PING_S": "0.2"})
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _model(server: LiveServer) -> str:
    return str(httpx.get(server.url + "/v1/models").json()["data"][0]["id"])


def test_embeddings_through_the_sdk_rank_similar_sentences_higher(server: LiveServer,
                                                                   client: openai.OpenAI) -> None:
    texts = ["The cat sat on the mat.", "A kitten rested on the rug.", "Interest rates rose again."]
    out = client.embeddings.create(model=_model(server), input=texts)
    vecs = [np.array(d.embedding) for d in out.data]
    assert len(vecs) == 3 and out.usage.prompt_tokens > 3
    assert float(vecs[0] @ vecs[1]) > float(vecs[0] @ vecs[2])
    b64 = client.embeddings.create(model=_model(server), input=texts[0], encoding_format="base64")
    raw = base64.b64decode(b64.data[0].embedding)  # asked for explicitly: the SDK hands it over as is
    assert np.allclose(np.frombuffer(raw, dtype="<f4"), vecs[0], atol=1e-5)
    with pytest.raises(openai.BadRequestError) as exc:
        client.embeddings.create(model=_model(server), input="x", dimensions=16)
    assert "dimensions" in str(exc.value)


def test_chat_logprobs_streaming_and_not(server: LiveServer, client: openai.OpenAI) -> None:
    msgs = [{"role": "user", "content": "Say hello."}]
    full = client.chat.completions.create(model=_model(server), messages=msgs, max_tokens=6, temperature=0,
                                          logprobs=True, top_logprobs=2)
    content = full.choices[0].logprobs.content
    assert len(content) == full.usage.completion_tokens
    assert "".join(t.token for t in content) == full.choices[0].message.content
    assert all(len(t.top_logprobs) == 2 and t.top_logprobs[0].logprob == pytest.approx(t.logprob)
               for t in content)
    assert all(bytes(t.bytes).decode("utf-8", "replace") == t.token for t in content)
    streamed = []
    for chunk in client.chat.completions.create(model=_model(server), messages=msgs, max_tokens=6,
                                                temperature=0, logprobs=True, stream=True):
        if chunk.choices and chunk.choices[0].logprobs is not None:
            streamed += [t.token for t in chunk.choices[0].logprobs.content]
    assert streamed == [t.token for t in content]
    plain = client.chat.completions.create(model=_model(server), messages=msgs, max_tokens=4)
    assert plain.choices[0].logprobs is None


def test_completions_logprobs_legacy_shape(server: LiveServer, client: openai.OpenAI) -> None:
    out = client.completions.create(model=_model(server), prompt="One, two,", max_tokens=4, temperature=0,
                                    logprobs=2)
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert lp.text_offset[0] == 0 and "".join(lp.tokens) == out.choices[0].text


def _stream_one(url: str, model: str, results: list[int], started: threading.Event | None = None) -> None:
    body = {"model": model, "messages": [{"role": "user", "content": "Count to fifty."}], "max_tokens": 48,
            "temperature": 0, "stream": True}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=120) as r:
        results.append(r.status_code)
        for _ in r.iter_lines():
            if started is not None:
                started.set()


def test_a_burst_of_slots_plus_queue_is_served_and_the_rest_refused(server: LiveServer) -> None:
    """--slots 2 --max-queue 2: a burst of 6 at once gets 4 served and 2 refused with Retry-After."""
    model = _model(server)
    statuses: list[int] = []
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        list(pool.map(lambda _: _stream_one(server.url, model, statuses), range(6)))
    assert sorted(statuses) == [200, 200, 200, 200, 503, 503]


def test_a_silent_stream_gets_keep_alive_pings(server: LiveServer) -> None:
    """Waiting for a slot writes nothing for a while: sse-starlette's comment lines keep it alive."""
    model = _model(server)
    started = [threading.Event(), threading.Event()]
    held: list[int] = []
    workers = [threading.Thread(target=_stream_one, args=(server.url, model, held, ev)) for ev in started]
    for w in workers:
        w.start()
    for ev in started:
        assert ev.wait(60)  # both slots stream
    body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "stream": True}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=120) as r:
        lines = list(r.iter_lines())
    for w in workers:
        w.join()
    first_token = next(i for i, ln in enumerate(lines) if ln.startswith("data: ") and '"content":"' in ln
                       and '"content":""' not in ln)
    assert any(ln.startswith(": ping") for ln in lines[:first_token])  # pinged while it waited for a slot
    assert "data: [DONE]" in lines
