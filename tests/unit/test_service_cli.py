"""CLI pieces without a model: chat REPL, run's generation loop, status summary, model choice,
the HTTP client against an in-process app, and `service install --print`."""

from __future__ import annotations

import argparse
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from edge.commands import chat, run, service, status
from edge.config import Settings
from edge.errors import EngineStopped, ModelNotFound, Unauthorized
from edge.service.client import ApiClient
from edge.service.launch import choose_model
from tests.fakes import ScriptedEngine, make_app


def test_chat_repl_keeps_history_and_handles_commands() -> None:
    seen: list[list[dict[str, str]]] = []

    def reply(history: list[dict[str, str]]) -> Iterator[str]:
        seen.append([dict(m) for m in history])
        yield "ok "
        yield str(len(history))

    inp = io.StringIO("hello\n\nagain\n/reset\nfresh\n/exit\nnever\n")
    out = io.StringIO()
    turns = chat.repl(reply, "be brief", inp, out)
    assert turns == 3
    assert [m["role"] for m in seen[1]] == ["system", "user", "assistant", "user"]
    assert seen[1][2]["content"] == "ok 2"
    assert [m["content"] for m in seen[2]] == ["be brief", "fresh"]  # /reset kept the system message
    assert "(history cleared)" in out.getvalue()
    assert len(seen) == 3  # nothing after /exit


def test_chat_engine_reply_streams_in_process() -> None:
    engine = ScriptedEngine()
    engine.start()
    from edge.runtime.types import SamplingParams

    pieces = list(chat.engine_reply(engine, 3, SamplingParams())([{"role": "user", "content": "hi"}]))
    assert pieces == ["tok0 ", "tok1 ", "tok2 "]
    assert engine.submitted[-1].add_bos is False


def _run_args(**kw: Any) -> argparse.Namespace:
    base = {"raw": False, "system": None, "max_tokens": 5, "temperature": None, "seed": None}
    return argparse.Namespace(**{**base, **kw})


def test_run_generate_streams_and_reports_stats() -> None:
    engine = ScriptedEngine()
    engine.start()
    out, err = io.StringIO(), io.StringIO()
    req = run.build_request(engine, "two words", _run_args(temperature=0.0, seed=3))
    assert req.add_bos is False and req.sampling.temperature == 0.0 and req.sampling.seed == 3
    assert run.generate(engine, req, out, err, stats=True) == 0
    assert out.getvalue() == "tok0 tok1 tok2 tok3 tok4 \n"
    assert "5 generated" in err.getvalue() and "finish length" in err.getvalue()


def test_run_falls_back_to_plain_prompt_without_template() -> None:
    engine = ScriptedEngine(chat_template=False)
    engine.start()
    req = run.build_request(engine, "plain", _run_args())
    assert req.prompt == "plain" and req.add_bos is True
    assert run.build_request(ScriptedEngine(), "x", _run_args(raw=True)).prompt == "x"


def test_run_raises_engine_errors() -> None:
    engine = ScriptedEngine(fail_with=EngineStopped("boom"))
    engine.start()
    with pytest.raises(EngineStopped):
        run.generate(engine, run.build_request(engine, "x", _run_args()), io.StringIO(), io.StringIO(), False)
    assert engine.submitted[-1].max_tokens == 5


class FakeStore:
    def __init__(self, root: Path, pulled: Path) -> None:
        self.catalog = {"tiny": object()}
        self.pulled = pulled
        self.ensured: list[str] = []

    def path_of(self, name: str) -> Path | None:
        return None

    def ensure(self, name: str) -> Path:
        self.ensured.append(name)
        if name != "tiny":
            raise ModelNotFound(name)
        return self.pulled


def test_choose_model_pulls_catalog_names_with_a_message(tmp_path: Path) -> None:
    gguf = tmp_path / "Tiny-Q4.gguf"
    gguf.write_bytes(b"GGUF")
    stores: list[FakeStore] = []

    def factory(root: Path) -> FakeStore:
        stores.append(FakeStore(root, gguf))
        return stores[-1]

    msg = io.StringIO()
    choice = choose_model(None, Settings(default_model="tiny", models_dir=tmp_path), msg, factory)
    assert choice.path == gguf and choice.model_id == "tiny"
    assert {"tiny", "Tiny-Q4.gguf", "Tiny-Q4"} <= choice.aliases
    assert "pulling it first" in msg.getvalue()
    by_path = choose_model(str(gguf), Settings(models_dir=tmp_path), msg, factory)
    assert by_path.model_id == "Tiny-Q4" and str(gguf) in by_path.aliases
    with pytest.raises(ModelNotFound):
        choose_model("nope", Settings(models_dir=tmp_path), msg, factory)


class _Resp(io.BytesIO):
    def __enter__(self) -> _Resp:
        return self

    def __exit__(self, *a: object) -> None:
        self.close()


def _opener_for(client: TestClient):
    """urllib-style opener backed by a TestClient (no sockets)."""
    import urllib.error

    def opener(req: Any, timeout: float = 0) -> _Resp:
        r = client.request(
            req.get_method(),
            req.full_url.replace("http://x", ""),
            content=req.data,
            headers=dict(req.header_items()),
        )
        if r.status_code >= 400:
            raise urllib.error.HTTPError(
                req.full_url, r.status_code, r.reason_phrase, r.headers, io.BytesIO(r.content)
            )
        return _Resp(r.content)

    return opener


def test_api_client_chat_stream_status_and_errors() -> None:
    app, _ = make_app(api_key="k")
    tc = TestClient(app)
    client = ApiClient("http://x", "k", opener=_opener_for(tc))
    assert client.model_id() == "scripted-model"
    pieces = list(client.stream_chat([{"role": "user", "content": "hi"}], "scripted-model", max_tokens=2))
    assert pieces == ["tok0 ", "tok1 "]
    summary = status.summarize(client.get_json("/v1/status"))
    assert "scripted-model" in summary and "0/2 active" in summary
    with pytest.raises(Unauthorized):
        ApiClient("http://x", "bad", opener=_opener_for(tc)).model_id()
    with pytest.raises(ModelNotFound):
        list(client.stream_chat([{"role": "user", "content": "hi"}], "other"))


def test_service_install_print(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = argparse.ArgumentParser()
    service.register(p.add_subparsers())
    args = p.parse_args(
        [
            "service",
            "install",
            "--print",
            "--user",
            "edge",
            "--models-dir",
            str(tmp_path),
            "--exec",
            "/opt/edge/bin/edge",
            "--model",
            "tiny",
        ]
    )
    assert args.func(args) == 0
    text = capsys.readouterr().out
    assert "User=edge" in text and "DynamicUser" not in text
    assert "ExecStart=/opt/edge/bin/edge serve tiny" in text
    assert f"ReadWritePaths={tmp_path}" in text


def test_scheduler_is_sized_to_the_engine_and_profile() -> None:
    from edge.api.app import create_app
    from edge.config import load_profile
    from edge.runtime.types import Knobs
    from edge.service.launch import build_scheduler

    engine = ScriptedEngine(n_slots=3)
    engine.apply(Knobs(active_limit=3, n_threads=6))
    settings = Settings(telemetry="none", max_queue=7, profile="jetson-orin-nano")
    sched = build_scheduler(settings, engine)
    profile = load_profile("jetson-orin-nano")
    assert (sched.config.n_slots, sched.config.max_threads) == (3, 6)
    assert sched.config.limit_c == profile.thermal_limit_c
    assert sched.config.reserve_bytes == profile.memory_reserve_bytes
    assert sched.admission.max_queue == 7
    engine.start()
    app = create_app(settings, engine, sched, api_key="")
    assert app.state.edge.admission is sched.admission  # the scheduler's admission replaces the plain bound
    sched.tick()
    status = TestClient(app).get("/v1/status").json()
    assert status["scheduler"]["ticks"] == 1 and status["queue"]["kind"] == "scheduler"
