"""The audit trail: one JSON line per request with who/what/how much, never the text; named keys;
size rotation that keeps N files and appends across restarts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from edge.api.app import create_app
from edge.api.audit import AuditLog
from edge.config import Settings
from edge.errors import ConfigError
from tests.fakes import CHAT, ScriptedEngine

SECRET_WORDS = ("zebra", "quartz", "marmalade")  # the prompt's words: never in the audit file
PROMPT = {"model": "scripted-model", "messages": [{"role": "user", "content": " ".join(SECRET_WORDS)}]}
FIELDS = {"time", "request_id", "client", "key", "method", "path", "model", "status", "prompt_tokens",
          "completion_tokens", "duration_ms"}


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _app(tmp_path: Path, keys: str | None = None, **settings: Any) -> tuple[TestClient, Path]:
    log = tmp_path / "logs" / "audit.jsonl"
    key_file = None
    if keys is not None:
        key_file = tmp_path / "keys"
        key_file.write_text(keys, encoding="utf-8")
    engine = ScriptedEngine()
    engine.start()
    app = create_app(Settings(audit_log=log, api_key_file=key_file, **settings), engine)
    return TestClient(app), log


def test_one_line_per_request_with_the_fields_and_none_of_the_prompt(tmp_path: Path) -> None:
    client, log = _app(tmp_path, keys="alice:key-a\nbob:key-b\n")
    alice, bob = {"Authorization": "Bearer key-a"}, {"Authorization": "Bearer key-b"}
    r = client.post("/v1/chat/completions", json={**PROMPT, "max_tokens": 3}, headers=alice)
    assert r.status_code == 200
    usage = r.json()["usage"]
    with client.stream("POST", "/v1/chat/completions", json={**PROMPT, "stream": True, "max_tokens": 2},
                       headers={**bob, "X-Request-ID": "rid-from-balancer"}) as s:
        assert s.status_code == 200 and s.headers["x-request-id"] == "rid-from-balancer"
        s.read()
    e = client.post("/v1/embeddings", json={"model": "scripted-model", "input": "zebra quartz"},
                    headers=alice)
    assert e.status_code == 200
    assert client.post("/v1/chat/completions", json=PROMPT).status_code == 401  # no key: audited too
    assert client.get("/health").status_code == 200  # the probes are not audited
    assert client.get("/ready").status_code == 200

    text = log.read_text(encoding="utf-8")
    assert not [w for w in SECRET_WORDS if w in text]
    chat, stream, embed, refused = lines = _lines(log)
    assert all(set(line) == FIELDS for line in lines)
    assert (chat["key"], chat["method"], chat["path"], chat["status"]) == ("alice", "POST",
                                                                         "/v1/chat/completions", 200)
    assert (chat["prompt_tokens"], chat["completion_tokens"]) == (usage["prompt_tokens"],
                                                                 usage["completion_tokens"])
    assert chat["model"] == "scripted-model" and chat["client"] == "testclient"
    assert chat["time"].endswith("Z") and chat["duration_ms"] >= 0
    assert len(chat["request_id"]) == 32 and chat["request_id"] == r.headers["x-request-id"]  # generated
    assert (stream["key"], stream["request_id"]) == ("bob", "rid-from-balancer")
    assert stream["completion_tokens"] == 2
    assert (embed["key"], embed["model"], embed["prompt_tokens"], embed["completion_tokens"]) == (
        "alice", "scripted-model", e.json()["usage"]["prompt_tokens"], 0)
    assert (refused["status"], refused["key"], refused["prompt_tokens"]) == (401, None, 0)
    assert refused["model"] is None


def test_without_a_key_the_line_names_no_key_and_untouched_model(tmp_path: Path) -> None:
    client, log = _app(tmp_path)
    assert client.get("/v1/models").status_code == 200
    (line,) = _lines(log)
    assert (line["key"], line["model"], line["status"], line["path"]) == (None, None, 200, "/v1/models")


def test_no_audit_log_setting_writes_nothing_and_generates_no_id(tmp_path: Path) -> None:
    engine = ScriptedEngine()
    engine.start()
    client = TestClient(create_app(Settings(), engine, api_key=""))
    assert "x-request-id" not in client.post("/v1/chat/completions", json=CHAT).headers
    assert not list(tmp_path.iterdir())


def test_rotation_keeps_n_files_and_appends_across_restarts(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    entry = {"path": "/v1/models", "pad": "x" * 80}
    first = AuditLog(path, max_bytes=300, backups=2)
    first.write({**entry, "n": 0})
    first.close()
    second = AuditLog(path, max_bytes=300, backups=2)  # a restart appends
    second.write({**entry, "n": 1})
    assert [e["n"] for e in _lines(path)] == [0, 1]
    for n in range(2, 12):
        second.write({**entry, "n": n})
    second.close()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["audit.jsonl", "audit.jsonl.1", "audit.jsonl.2"]
    assert all(p.stat().st_size <= 300 for p in tmp_path.iterdir())
    kept = [e["n"] for name in reversed(names) for e in _lines(tmp_path / name)]
    assert kept == sorted(kept) and kept[-1] == 11 and 0 not in kept  # oldest dropped, order kept


def test_an_unwritable_audit_path_fails_at_start(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match="audit_log"):
        AuditLog(blocker / "audit.jsonl", 1 << 20, 1)


@pytest.mark.parametrize(("text", "keys"), [
    ("plainkey\n", {"default": "plainkey"}),
    ("# operators\nalice: k1\n\nbob:k2\n", {"alice": "k1", "bob": "k2"}),
    ("ci:tok:with:colons\n", {"ci": "tok:with:colons"}),
])
def test_key_files(tmp_path: Path, text: str, keys: dict[str, str]) -> None:
    f = tmp_path / "keys"
    f.write_text(text)
    s = Settings(api_key_file=f)
    assert s.resolved_api_keys() == keys
    assert s.resolved_api_key() == next(iter(keys.values()))  # what `edge status` sends


@pytest.mark.parametrize("text", ["alice:k1\nalice:k2\n", "alice:k1\nbob:k1\n", "alice:k1\nnocolon\n",
                                  "alice:\n"])
def test_bad_key_files_are_config_errors_that_do_not_show_keys(tmp_path: Path, text: str) -> None:
    f = tmp_path / "keys"
    f.write_text(text)
    with pytest.raises(ConfigError) as info:
        Settings(api_key_file=f).resolved_api_keys()
    assert "k1" not in str(info.value) and "k2" not in str(info.value)


def test_every_named_key_works_when_serve_passes_the_first(tmp_path: Path) -> None:
    f = tmp_path / "keys"
    f.write_text("alice:key-a\nbob:key-b\n")
    engine = ScriptedEngine()
    engine.start()
    client = TestClient(create_app(Settings(api_key_file=f), engine, api_key="key-a"))
    for key, status in (("key-a", 200), ("key-b", 200), ("key-c", 401)):
        assert client.get("/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code == status


def _asgi(handler: Any) -> Any:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await handler(scope, send)

    return app


def _call(mw: Any, path: str = "/v1/chat/completions") -> None:
    import asyncio

    scope = {"type": "http", "method": "POST", "path": path, "client": ("10.0.0.7", 5555),
             "state": {"edge_leases": []}, "headers": []}

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        return None

    asyncio.run(mw(scope, receive, send))


def test_the_model_a_request_leased_and_failures_are_audited(tmp_path: Path) -> None:
    from edge.api.audit import AuditMiddleware, tally

    log = AuditLog(tmp_path / "a.jsonl", 1 << 20, 1)

    async def leased(scope: dict[str, Any], send: Any) -> None:
        tally(model="qwen")  # as ApiState.for_model does for the model a request leases
        tally(prompt_tokens=5, completion_tokens=2)
        await send({"type": "http.response.start", "status": 200, "headers": []})

    async def broken(scope: dict[str, Any], send: Any) -> None:
        raise RuntimeError("bug")

    times = iter([100.0, 100.25])
    _call(AuditMiddleware(_asgi(leased), log, lambda: "served", clock=lambda: 0.0, timer=lambda: next(times)))
    with pytest.raises(RuntimeError):
        _call(AuditMiddleware(_asgi(broken), log, lambda: "served"))
    log.close()
    ok, failed = _lines(tmp_path / "a.jsonl")
    assert (ok["model"], ok["prompt_tokens"], ok["completion_tokens"], ok["status"]) == ("qwen", 5, 2, 200)
    assert (ok["client"], ok["duration_ms"], ok["time"]) == ("10.0.0.7", 250.0, "1970-01-01T00:00:00.000Z")
    assert (failed["status"], failed["model"]) == (500, None)
