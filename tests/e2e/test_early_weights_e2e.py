"""A restart with the same command line maps the weights while Python still imports the server
(runtime/llama/early.py), evaluates the chat template's head meanwhile (prime.py), and serves
exactly what a start without that head start serves."""

from __future__ import annotations

import re
from pathlib import Path

import httpx

from edge.runtime.llama.prime import CHUNK_TOKENS
from tests.e2e.conftest import free_port, launch


def _complete(url: str) -> str:
    body = {"model": "SmolLM2-135M-Instruct.Q4_1", "prompt": "The capital of France is", "max_tokens": 8,
            "temperature": 0}
    r = httpx.post(url + "/v1/completions", json=body, timeout=60)
    r.raise_for_status()
    return str(r.json()["choices"][0]["text"])


def _chat(url: str) -> str:
    body = {"model": "SmolLM2-135M-Instruct.Q4_1", "messages": [{"role": "user", "content": "Say hi."}],
            "max_tokens": 8, "temperature": 0}
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=60)
    r.raise_for_status()
    return str(r.json()["choices"][0]["message"]["content"])


def test_a_restart_takes_the_weights_loaded_early_and_answers_the_same(smollm2_path: Path,
                                                                       tmp_path: Path) -> None:
    cache, port = tmp_path / "cache", free_port()
    env = {"EDGE_CACHE_DIR": str(cache)}  # a cache of this test's own: no record from other tests
    first = launch(tmp_path, smollm2_path, "--slots", "1", env=env, port=port)
    try:
        text, chat = _complete(first.url), _chat(first.url)
    finally:
        assert first.stop() == 0
    assert "loaded early" not in first.log()  # nothing recorded before the first start
    assert len(list((cache / "starts").glob("*.json"))) == 1

    second = launch(tmp_path, smollm2_path, "--slots", "1", env=env, port=port)
    try:
        assert _chat(second.url) == chat  # its first request: after the head primed at start
        assert _complete(second.url) == text
    finally:
        assert second.stop() == 0
    assert f"weights of {smollm2_path.name} loaded early" in second.log()
    assert f"context of {smollm2_path.name} made early" in second.log()  # and the same text above
    primed = re.search(r"chat template's first (\d+) tokens evaluated during the start", second.log())
    assert primed and CHUNK_TOKENS <= int(primed.group(1)) <= 24  # SmolLM2's head: 24 (a hurry: fewer)

    other = launch(tmp_path, smollm2_path, "--slots", "2", env=env, port=port)  # another command line
    try:
        assert _complete(other.url) == text
    finally:
        assert other.stop() == 0
    assert "loaded early" not in other.log() and "made early" not in other.log()
