"""The per-request speculation fields: validated at the API edge, passed to the engine as typed fields."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from edge.config import Settings
from tests.fakes import CHAT, make_app


@pytest.fixture()
def client_engine():  # type: ignore[no-untyped-def]
    app, engine = make_app()
    return TestClient(app), engine


def test_fields_reach_the_engine(client_engine) -> None:  # type: ignore[no-untyped-def]
    client, engine = client_engine
    r = client.post("/v1/chat/completions", json={**CHAT, "speculative": True, "n_draft": 4})
    assert r.status_code == 200
    assert engine.submitted[-1].speculative is True and engine.submitted[-1].n_draft == 4
    r = client.post("/v1/completions", json={"model": CHAT["model"], "prompt": "hi", "speculative": False})
    assert r.status_code == 200
    assert engine.submitted[-1].speculative is False and engine.submitted[-1].n_draft is None
    client.post("/v1/chat/completions", json=CHAT)
    assert engine.submitted[-1].speculative is None  # the engine's own choice


@pytest.mark.parametrize("extra, param", [
    ({"speculative": "yes"}, "speculative"),  # StrictBool: no coercion from strings
    ({"speculative": 1}, "speculative"),
    ({"n_draft": -1}, "n_draft"),
    ({"n_draft": 1000}, "n_draft"),
    ({"n_draft": 2.5}, "n_draft"),
])
def test_bad_values_are_a_400_naming_the_field(client_engine, extra, param) -> None:  # type: ignore[no-untyped-def]
    client, _ = client_engine
    r = client.post("/v1/chat/completions", json={**CHAT, **extra})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == param


def test_settings_speculative_mode_and_draft_model() -> None:
    assert Settings().speculative == "ngram" and Settings().draft_max == 16  # on by default for serve
    assert Settings(speculative="ngram").speculative == "ngram"
    with pytest.raises(Exception, match="draft_model"):
        Settings(speculative="draft")
    with pytest.raises(Exception):  # noqa: B017 - pydantic's ValidationError
        Settings(speculative="sometimes")
    with pytest.raises(Exception):  # noqa: B017
        Settings(draft_max=0)


def test_metrics_and_status_show_drafted_accepted_and_draft_length() -> None:
    from dataclasses import replace

    from prometheus_client.parser import text_string_to_metric_families

    app, engine = make_app()
    base = engine.stats
    engine.stats = lambda: replace(base(), speculative="ngram", spec_drafted=120, spec_accepted=90,  # type: ignore[method-assign]
                                   spec_draft_len=3.5)
    client = TestClient(app)
    got = {s.name: s.value for fam in text_string_to_metric_families(client.get("/metrics").text)
           for s in fam.samples}
    assert got["edge_spec_drafted_tokens_total"] == 120 and got["edge_spec_accepted_tokens_total"] == 90
    assert got["edge_spec_draft_len"] == 3.5 and got["edge_knob_speculate"] == 1.0
    eng = client.get("/v1/status").json()["engine"]
    assert eng["speculative"] == "ngram" and eng["spec_drafted"] == 120 and eng["spec_accepted"] == 90
    assert eng["spec_draft_len"] == 3.5
