"""The HTTP API over a model host: any model in the store by name, on every API, within the budget."""

from __future__ import annotations

from fastapi.testclient import TestClient

from edge.api.app import create_app
from edge.config import Settings
from tests.unit.test_model_host import Box, MiB


def client(budget_mib: int = 1300, **box_kw: object) -> tuple[TestClient, Box]:
    box = Box(budget_mib, **box_kw)  # type: ignore[arg-type]
    app = create_app(Settings(), box.host, None, api_key="", host=box.host)  # type: ignore[arg-type]
    return TestClient(app), box


def chat(c: TestClient, model: str) -> dict:
    r = c.post("/v1/chat/completions", json={"model": model, "messages": [{"role": "user", "content": "hi"}],
                                              "max_tokens": 4})
    assert r.status_code == 200, r.text
    return r.json()


def test_every_model_in_the_store_is_listed_and_answers_by_name() -> None:
    c, box = client()
    assert [m["id"] for m in c.get("/v1/models").json()["data"]] == ["gemma", "qwen", "smol"]
    assert {m["name"] for m in c.get("/api/tags").json()["models"]} == {"gemma:latest", "qwen:latest",
                                                                        "smol:latest"}
    for name in ("smol", "gemma", "qwen", "smol"):
        assert chat(c, name)["model"] == name
        assert box.engines[name].submitted  # the request ran on that model's engine
    ps = c.get("/api/ps").json()["models"]
    assert sum(m["size"] for m in ps) <= 1300 * MiB
    assert {m["name"] for m in ps} == {"smol:latest", "qwen:latest"}
    r = c.post("/api/generate", json={"model": "gemma", "prompt": "hi", "stream": False,
                                      "options": {"num_predict": 3}})
    assert r.status_code == 200 and r.json()["done"]
    r = c.post("/api/embed", json={"model": "qwen", "input": "hello"})
    assert r.status_code == 200 and len(r.json()["embeddings"]) == 1
    assert box.engines["qwen"].embedded  # embedded with the model named


def test_unknown_and_too_large_models_get_404_naming_close_ones_and_507_with_the_numbers() -> None:
    c, _box = client(1300, sizes={"smol": 400, "huge": 2000})
    r = c.post("/v1/chat/completions",
               json={"model": "smoll", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 404 and "smol" in r.json()["error"]["message"]
    chat(c, "smol")
    r = c.post("/api/chat", json={"model": "huge", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 507
    assert "2000 MiB" in r.json()["error"] and "1300 MiB" in r.json()["error"]  # Ollama's shape
    assert [m["name"] for m in c.get("/api/ps").json()["models"]] == ["smol:latest"]  # nothing unloaded


def test_ollama_load_and_unload_requests_act_on_the_model_named() -> None:
    c, box = client()
    r = c.post("/api/generate", json={"model": "gemma", "keep_alive": "10m"})
    assert r.json()["done_reason"] == "load"
    assert [m["name"] for m in c.get("/api/ps").json()["models"]] == ["gemma:latest"]
    assert box.engines["gemma"].keep_alive_s == 600.0
    r = c.post("/api/chat", json={"model": "gemma", "messages": [], "keep_alive": 0})
    assert r.json()["done_reason"] == "unload"
    assert c.get("/api/ps").json()["models"] == []


def test_status_and_metrics_show_each_model_and_the_budget() -> None:
    c, _box = client()
    chat(c, "smol")
    host = c.get("/v1/status").json()["host"]
    assert host["memory_budget_bytes"] == 1300 * MiB and host["resident_bytes"] == 400 * MiB
    rows = {m["model"]: m for m in host["models"]}
    assert rows["smol"]["state"] == "ready" and rows["smol"]["loads"] == 1 and rows["smol"]["requests"] == 0
    text = c.get("/metrics").text
    assert 'edge_model_state{model="smol",state="ready"} 1.0' in text
    assert 'edge_model_planned_bytes{model="smol"}' in text
    assert "edge_host_memory_budget_bytes" in text


def test_status_shows_the_memory_plan_of_the_model_served_first() -> None:
    box = Box(1300)
    app = create_app(Settings(), box.host, None, api_key="", host=box.host, model_id="smol")  # type: ignore[arg-type]
    c = TestClient(app)
    assert c.get("/v1/status").json()["plan"] is None  # not planned before its first load
    chat(c, "smol")
    chat(c, "gemma")
    plan = c.get("/v1/status").json()["plan"]
    assert plan is not None and plan["total_bytes"] - plan["reserve_bytes"] == 400 * MiB  # smol's


def test_a_request_leases_its_model_until_the_response_has_been_sent() -> None:
    c, box = client()
    chat(c, "smol")
    (h,) = [h for h in box.host.models() if h.ref.key == "smol"]
    assert h.leases == 0  # released by the middleware after the answer
    r = c.post("/v1/chat/completions", json={"model": "smol", "stream": True, "max_tokens": 3,
                                              "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200 and "[DONE]" in r.text
    assert h.leases == 0


def test_edge_status_prints_a_line_per_hosted_model_and_the_budget() -> None:
    from edge.commands.status import host_lines

    c, _box = client()
    chat(c, "gemma")
    lines = host_lines(c.get("/v1/status").json()["host"])
    assert lines[0].startswith("memory    470 of 1300 MiB")
    (gemma,) = [line for line in lines if "gemma" in line]
    assert "ready" in gemma and "470 MiB" in gemma and "0 requests" in gemma
    assert host_lines(None) == []


def test_ollama_num_ctx_is_checked_against_the_named_models_own_context() -> None:
    c, _box = client()
    ask = {"model": "qwen", "messages": [{"role": "user", "content": "hi"}], "stream": False}
    r = c.post("/api/chat", json={**ask, "options": {"num_ctx": 32, "num_predict": 2}})
    assert r.status_code == 200, r.text  # not refused against an empty host's context
    r = c.post("/api/chat", json={**ask, "options": {"num_ctx": 128}})
    assert r.status_code == 400 and "64" in r.json()["error"]


def test_the_audit_line_names_the_model_the_request_ran_on(tmp_path) -> None:
    import json

    box = Box()
    app = create_app(Settings(audit_log=tmp_path / "audit.jsonl"), box.host, None, api_key="",  # type: ignore[arg-type]
                     host=box.host)
    with TestClient(app) as c:
        chat(c, "gemma")
    (line,) = [json.loads(x) for x in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert line["model"] == "gemma" and line["status"] == 200
