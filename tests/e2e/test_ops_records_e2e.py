"""Two real starts of `edge serve` on SmolLM2: the audit trail (named keys, one line per request,
none of the prompt's words, appended across the restart), the deployment record of each start,
`edge history --diff` naming the setting changed between them, and the build on /api/version."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import REPO, LiveServer, cli_cmd

pytestmark = [pytest.mark.e2e, pytest.mark.model]

WORDS = ("periwinkle", "xylophone", "buttermilk")  # the prompt's words: never in the audit file
PORTS = range(18300, 18400)  # a range of its own on a shared box


def _port() -> int:
    for port in PORTS:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError(f"no free port in {PORTS}")


def _start(tmp: Path, model: Path, env: dict[str, str], *args: str) -> LiveServer:
    port = _port()
    log_path = tmp / f"server-{port}.log"
    cmd = cli_cmd("serve", str(model), "--port", str(port), "--threads", "1", *args)
    with log_path.open("w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO, text=True)
    server = LiveServer(proc, f"http://127.0.0.1:{port}", log_path)
    try:
        server.wait_ready()
    except BaseException:
        server.stop(10.0)
        raise
    return server


def _requests(url: str) -> None:
    alice, bob = {"Authorization": "Bearer key-a"}, {"Authorization": "Bearer key-b"}
    chat = {"model": "x", "messages": [{"role": "user", "content": " ".join(WORDS)}], "max_tokens": 4,
            "temperature": 0}
    r = httpx.post(url + "/v1/chat/completions", json={**chat, "model": _model(url, alice)}, headers=alice,
                   timeout=120)
    assert r.status_code == 200, r.text
    assert httpx.post(url + "/v1/chat/completions", json=chat, timeout=30).status_code == 401
    v = httpx.get(url + "/api/version", headers=bob, timeout=30).json()
    assert v["llama_cpp_python"] and v["llama_cpp_commit"] and "cpu" in v["backends"]


def _model(url: str, headers: dict[str, str]) -> str:
    return str(httpx.get(url + "/v1/models", headers=headers, timeout=30).json()["data"][0]["id"])


def test_audit_trail_and_deployment_records_across_two_starts(smollm2_path: Path, tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("alice:key-a\nbob:key-b\n")
    audit = tmp_path / "audit" / "requests.jsonl"
    state = tmp_path / "state"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "EDGE_STATE_DIR": str(state)}
    env.pop("EDGE_API_KEY", None)
    common = ("--api-key-file", str(keys), "--audit-log", str(audit))
    for slots in ("2", "1"):
        server = _start(tmp_path, smollm2_path, env, *common, "--slots", slots)
        try:
            _requests(server.url)
        finally:
            assert server.stop() == 0
        assert "llama.cpp build" in server.log() and "deployment record" in server.log()

    lines = [json.loads(x) for x in audit.read_text().splitlines()]
    assert not [w for w in WORDS if w in audit.read_text()]
    assert [(x["path"], x["status"], x["key"]) for x in lines] == [
        ("/v1/models", 200, "alice"), ("/v1/chat/completions", 200, "alice"),
        ("/v1/chat/completions", 401, None), ("/api/version", 200, "bob")] * 2  # appended on restart
    chat = lines[1]
    assert chat["prompt_tokens"] > 3 and 1 <= chat["completion_tokens"] <= 4 and chat["model"]
    assert chat["client"] == "127.0.0.1" and len(chat["request_id"]) == 32 and chat["duration_ms"] > 0

    records = sorted((state / "deployments").glob("*.json"))
    assert len(records) == 2
    first = json.loads(records[0].read_text())
    (served,) = first["models"]
    assert served["quantization"] == "Q4_1" and len(served["sha256"]) == 64
    assert first["settings"]["slots"] == {"value": 2, "from": "flag"}
    assert first["settings"]["audit_log"]["from"] == "flag"
    out = subprocess.run(cli_cmd("history", "--diff"), env=env, cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "settings.slots: 2 (flag) -> 1 (flag)" in out.stdout
