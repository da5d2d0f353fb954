"""/v1/embeddings over a scripted engine: OpenAI shapes, encodings, limits and refusals."""

from __future__ import annotations

import asyncio
import base64
import struct
from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient

from edge.api.embeddings import _Claim
from edge.errors import RequestShed
from edge.runtime.types import Priority
from edge.scheduler.admission import Admission
from tests.fakes import ScriptedEngine, make_app

URL = "/v1/embeddings"


@pytest.fixture
def client_engine() -> tuple[TestClient, ScriptedEngine]:
    app, engine = make_app()
    return TestClient(app), engine


def test_a_string_a_list_and_token_ids_get_one_unit_vector_each(client_engine) -> None:
    client, engine = client_engine
    r = client.post(URL, json={"model": "scripted-model", "input": ["red apple", "green apple", "tax law"]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and body["model"] == "scripted-model"
    assert [d["index"] for d in body["data"]] == [0, 1, 2]
    vecs = [d["embedding"] for d in body["data"]]
    assert all(len(v) == 8 and abs(sum(x * x for x in v) - 1.0) < 1e-9 for v in vecs)
    assert body["usage"] == {"prompt_tokens": 9, "total_tokens": 9}  # 3 x (BOS + 2 words)
    one = client.post(URL, json={"model": "scripted-model", "input": "red apple"}).json()
    assert one["data"][0]["embedding"] == vecs[0]
    ids = client.post(URL, json={"model": "scripted-model", "input": [5, 6, 7]}).json()
    assert len(ids["data"]) == 1 and engine.embedded[-1] == [[5, 6, 7]]
    many = client.post(URL, json={"model": "scripted-model", "input": [[5, 6], [7]]}).json()
    assert len(many["data"]) == 2


def test_base64_is_little_endian_float32(client_engine) -> None:
    client, _ = client_engine
    plain = client.post(URL, json={"model": "scripted-model", "input": "x y"}).json()["data"][0]["embedding"]
    b64 = client.post(URL, json={"model": "scripted-model", "input": "x y",
                                 "encoding_format": "base64"}).json()["data"][0]["embedding"]
    decoded = struct.unpack("<8f", base64.b64decode(b64))
    assert decoded == pytest.approx(plain, abs=1e-6)


@pytest.mark.parametrize(("body", "status", "param"), [
    ({"input": "x", "dimensions": 4}, 400, "dimensions"),  # these models cannot be shortened
    ({"input": [True, 3]}, 400, "input"),  # booleans are not token ids
    ({"input": []}, 400, "input"),
    ({"input": "word " * 40}, 400, None),  # longer than the embeddings context: sizes in the message
    ({"input": "x", "encoding_format": "hex"}, 400, "encoding_format"),
    ({"input": "x", "frobnicate": 1}, 400, "frobnicate"),
    ({"model": "other-model", "input": "x"}, 404, None),
])
def test_bad_embedding_requests_get_a_clear_4xx(client_engine, body: dict, status: int,
                                                param: str | None) -> None:
    client, engine = client_engine
    r = client.post(URL, json={"model": "scripted-model", **body})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    if param is not None:
        assert err["param"] == param
    if "word" in str(body.get("input")):
        assert "41" in err["message"] and "32" in err["message"]  # its tokens and the limit
    assert engine.embedded == []


def test_dimensions_equal_to_the_models_own_are_accepted_and_text_plain_is_refused(client_engine) -> None:
    client, _ = client_engine
    ok = client.post(URL, json={"model": "scripted-model", "input": "x", "dimensions": 8})
    assert ok.status_code == 200
    r = client.post(URL, content=b'{"model": "scripted-model", "input": "x"}',
                    headers={"content-type": "text/plain"})
    assert r.status_code == 415


def test_the_openapi_document_describes_the_embeddings_body(client_engine) -> None:
    client, _ = client_engine
    doc = client.get("/openapi.json").json()
    schema = doc["paths"]["/v1/embeddings"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert schema["$ref"].endswith("/EmbeddingRequest")
    props = doc["components"]["schemas"]["EmbeddingRequest"]["properties"]
    assert {"model", "input", "encoding_format", "dimensions"} <= set(props)


def test_embeddings_share_the_generation_admission_queue_bound_and_retry_after() -> None:
    """One admission for both kinds of work: a full queue refuses embeddings as it refuses chats
    (503 + Retry-After, counted with the generation refusals), and an admitted embeddings request
    holds its place only while it runs."""
    adm = Admission(max_queue=0, n_slots=1)
    app, _ = make_app(admission=adm)
    client = TestClient(app)
    waiting = adm.admit(Priority.INTERACTIVE, 4, 4)  # a generation holds the only place
    for url, body in ((URL, {"model": "scripted-model", "input": "x"}),
                      ("/api/embed", {"model": "scripted-model", "input": "x"}),
                      ("/api/embeddings", {"model": "scripted-model", "prompt": "x"})):
        r = client.post(url, json=body)
        assert r.status_code == 503, (url, r.text)
        assert int(r.headers["retry-after"]) >= 1
    assert adm.status()["rejected"] == {"QueueFull": 3}
    waiting.release()
    r = client.post(URL, json={"model": "scripted-model", "input": "x"})
    assert r.status_code == 200 and adm.in_flight == 0  # admitted, then released


def test_background_embeddings_meet_the_background_admission_rules() -> None:
    adm = Admission(max_queue=1, n_slots=1, background_share=0.0)  # background work may not wait
    app, _ = make_app(admission=adm)
    client = TestClient(app)
    adm.admit(Priority.INTERACTIVE, 4, 4)  # waits for the slot: a request beside it would wait too
    body = {"model": "scripted-model", "input": "x"}
    assert client.post(URL, json=body).status_code == 200
    r = client.post(URL, json=body, headers={"X-Edge-Priority": "background"})
    assert r.status_code == 503 and "retry-after" in r.headers
    assert client.post(URL, json=body, headers={"X-Edge-Priority": "urgent"}).status_code == 400


def test_a_shed_embeddings_request_ends_with_the_shed_error() -> None:
    """The scheduler sheds admitted work to protect the device; an embeddings job goes with it."""
    engine = ScriptedEngine()
    engine.start()
    adm = Admission(max_queue=4, n_slots=1)
    claim = _Claim(adm.admit(Priority.BACKGROUND, 0, 0))
    shed = RequestShed(reason="memory low", retry_after_s=7.0)
    claim.ticket._shed(shed)  # type: ignore[attr-defined]  # as Admission.update does
    st = SimpleNamespace(engine=engine)
    with pytest.raises(RequestShed):
        asyncio.run(claim.run(st, ["x"], False))  # type: ignore[arg-type]
