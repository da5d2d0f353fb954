"""A restart with the same command line maps the weights while Python still imports the server
(runtime/llama/early.py), evaluates the chat template's head meanwhile (prime.py), and serves
exactly what a start without that head start serves; a command line never run loads the model
file it names early, and takes the context that file last had where it is the one asked for."""

from __future__ import annotations

import json
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


def _chat(url: str, model: str = "SmolLM2-135M-Instruct.Q4_1") -> str:
    body = {"model": model, "messages": [{"role": "user", "content": "Say hi."}],
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
    # nothing recorded before the first start: the file named loads early, nothing else does
    assert f"weights of {smollm2_path.name} loaded early, beside the start's imports (named on the " \
        "command line)" in first.log()
    assert "made early" not in first.log()
    assert _primed(first.log()) <= 24  # the head primed until the API was imported, maybe none
    assert len(list((cache / "starts").glob("*.json"))) == 1  # the command line's record
    assert len(list((cache / "starts" / "files").glob("*.json"))) == 1  # the file's

    second = launch(tmp_path, smollm2_path, "--slots", "1", env=env, port=port)
    try:
        assert _chat(second.url) == chat  # its first request: after the head primed at start
        assert _complete(second.url) == text
    finally:
        assert second.stop() == 0
    assert f"weights of {smollm2_path.name} loaded early" in second.log()
    assert f"context of {smollm2_path.name} made early" in second.log()  # and the same text above
    assert CHUNK_TOKENS <= _primed(second.log()) <= 24  # SmolLM2's head: 24 (a hurry: fewer)

    other = launch(tmp_path, smollm2_path, "--slots", "2", env=env, port=port)  # another command line
    try:
        assert _complete(other.url) == text
    finally:
        assert other.stop() == 0
    assert "(named on the command line)" in other.log()  # the file's record: a context for 1 slot
    assert "made early" not in other.log()  # not the 2 asked for: made anew

    again = launch(tmp_path, smollm2_path, "--slots", "2", env=env)  # yet another (port): as `other`
    try:
        assert _chat(again.url) == chat
    finally:
        assert again.stop() == 0
    assert f"context of {smollm2_path.name} made early" in again.log()  # the file's record, updated


def _primed(log: str) -> int:
    """How many head tokens a start's log says it evaluated (0: none)."""
    primed = re.search(r"chat template's first (\d+) tokens evaluated during the start", log)
    return int(primed.group(1)) if primed else 0


def test_a_new_command_line_naming_a_store_model_loads_its_file_early(smollm2_path: Path,
                                                                      tmp_path: Path) -> None:
    """A model named from the store resolves after the settings: the next start, even with another
    port, loads the file that name had, with its context and head (start_records.py)."""
    store = tmp_path / "models"
    store.mkdir()
    (store / smollm2_path.name).symlink_to(smollm2_path)
    (store / "manifest.json").write_text(json.dumps(
        {"smollm2-135m-instruct": {"file": smollm2_path.name, "sha256": "", "source": "test"}}))
    env = {"EDGE_CACHE_DIR": str(tmp_path / "cache")}
    texts, logs = [], []
    for _ in range(2):  # two command lines: each its own port
        s = launch(tmp_path, Path("smollm2-135m-instruct"), "--slots", "1", env=env)
        try:
            texts.append(_chat(s.url, "smollm2-135m-instruct"))
        finally:
            assert s.stop() == 0
        logs.append(s.log())
    assert texts[0] == texts[1]
    assert "loaded early" not in logs[0]
    assert f"weights of {smollm2_path.name} loaded early, beside the start's imports (named on the " \
        "command line)" in logs[1]
    assert f"context of {smollm2_path.name} made early" in logs[1]
    assert CHUNK_TOKENS <= _primed(logs[1]) <= 24
