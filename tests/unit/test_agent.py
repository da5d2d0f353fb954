"""The HAProxy agent check: one line per connection on loopback, and where it may bind."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from edge.config import load_settings
from edge.errors import ConfigError
from edge.runtime.types import Knobs, Priority
from edge.scheduler.headroom import AgentState, AgentWeight
from edge.service.agent import AgentServer, agent_bind
from tests.fakes import ScriptedEngine, make_app


async def _ask(port: int, send: bytes = b"") -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    if send:
        writer.write(send)
        await writer.drain()
    data = await asyncio.wait_for(reader.read(), 5.0)  # until the agent closes
    writer.close()
    return data


def test_agent_answers_one_line_then_closes_and_follows_the_weight() -> None:
    answers = [AgentWeight(AgentState.UP, 60, "thermal 0.60"), AgentWeight(AgentState.DRAIN, 0, "draining"),
               AgentWeight(AgentState.DOWN, 0, "loading model")]
    now = [0.0]

    async def main() -> list[bytes]:
        agent = AgentServer(lambda: answers[0], "127.0.0.1", 0, clock=lambda: now[0], announce_ready_s=30.0)
        await agent.start()
        try:
            got = [await _ask(agent.port)]
            now[0] = 31.0  # past the start window: no more `ready`
            got.append(await _ask(agent.port, b"hello\n"))  # an agent-send string is ignored
            answers.pop(0)
            got.append(await _ask(agent.port))
            answers.pop(0)
            got.append(await _ask(agent.port))
            assert agent.answers == 4 and agent.last == answers[0]
        finally:
            await agent.close()
        return got

    assert asyncio.run(main()) == [b"up ready 60%\n", b"up 60%\n", b"drain\n", b"down #loading model\n"]


def test_a_failing_weight_answers_down_not_a_traceback() -> None:
    def broken() -> AgentWeight:
        raise RuntimeError("boom")

    async def main() -> bytes:
        agent = AgentServer(broken, "127.0.0.1", 0)
        await agent.start()
        try:
            return await _ask(agent.port)
        finally:
            await agent.close()

    assert asyncio.run(main()) == b"down #weight unavailable: RuntimeError\n"


def test_agent_serves_the_apps_weight_and_status_shows_it() -> None:
    app, engine = make_app(agent_port=18089)
    st = app.state.edge

    async def main() -> bytes:
        agent = AgentServer(st.balancer_weight, "127.0.0.1", 0, announce_ready_s=0.0)
        await agent.start()
        try:
            first = await _ask(agent.port)
            engine.apply(Knobs(active_limit=0, n_threads=1, paused=True))
            second = await _ask(agent.port)
            st.begin_drain()
            return first + second + await _ask(agent.port)
        finally:
            await agent.close()

    assert asyncio.run(main()) == (b"up 100%\ndown #paused by the scheduler (device hot or short of memory)\n"
                                   b"drain\n")
    b = TestClient(app).get("/v1/status").json()["balancer"]
    assert b["state"] == "drain" and b["agent"] == {"host": "127.0.0.1", "port": 18089}


def test_agent_port_in_use_is_an_oserror_at_start() -> None:
    async def main() -> None:
        first = AgentServer(lambda: AgentWeight(AgentState.UP, 100, ""), "127.0.0.1", 0)
        await first.start()
        try:
            with pytest.raises(OSError):
                await AgentServer(lambda: AgentWeight(AgentState.UP, 100, ""), "127.0.0.1",
                                  first.port).start()
        finally:
            await first.close()

    asyncio.run(main())


def test_agent_bind_is_off_by_default_loopback_unless_keyed(tmp_path: Path) -> None:
    assert agent_bind(load_settings(), keyed=False) is None
    assert agent_bind(load_settings(agent_port=8089), keyed=False) == ("127.0.0.1", 8089)
    assert agent_bind(load_settings(agent_port=8089, agent_host="::1"), keyed=False) == ("::1", 8089)
    off_loopback = load_settings(agent_port=8089, agent_host="0.0.0.0")
    with pytest.raises(ConfigError) as err:
        agent_bind(off_loopback, keyed=False)
    assert err.value.field == "agent_host" and "API key" in err.value.reason
    assert agent_bind(off_loopback, keyed=True) == ("0.0.0.0", 8089)
    assert agent_bind(load_settings(agent_port=8089, agent_host="0.0.0.0", insecure=True), keyed=False) == (
        "0.0.0.0", 8089)
    for bad in (0, 70000):
        with pytest.raises(ConfigError):
            load_settings(agent_port=bad)


def test_edge_status_shows_the_agents_weight_and_why() -> None:
    from edge.commands.status import summarize

    app, engine = make_app(ScriptedEngine(n_slots=2, autostep=False), agent_port=8089)
    adm = app.state.edge.admission
    adm.admit(Priority.INTERACTIVE, 4, 4).start()
    text = summarize(TestClient(app).get("/v1/status").json())
    line = next(ln for ln in text.splitlines() if ln.startswith("balancer"))
    assert line == ("balancer  up 88% (slots 0.88: 1 of 2 slots busy); agent 127.0.0.1:8089; "
                    "headroom slots 0.88, queue 1.00")
    engine.apply(Knobs(active_limit=0, n_threads=1, paused=True))
    text = summarize(TestClient(app).get("/v1/status").json())
    assert "balancer  down #paused by the scheduler" in text
    off, _ = make_app()
    assert "agent off" in summarize(TestClient(off).get("/v1/status").json())


def test_service_install_passes_the_agent_flags_and_refuses_an_open_agent(tmp_path: Path, capsys) -> None:
    from edge.cli import main

    exe = ["--exec", "/opt/edge/bin/edge", "--models-dir", str(tmp_path)]
    key = tmp_path / "key"
    key.write_text("k")
    assert main(["service", "install", "--print", *exe, "--host", "0.0.0.0", "--api-key-file", str(key),
                 "--agent-port", "8089", "--agent-host", "0.0.0.0"]) == 0
    unit = capsys.readouterr().out
    assert "--agent-port 8089 --agent-host 0.0.0.0" in unit
    assert main(["service", "install", "--print", *exe, "--agent-port", "8089",
                 "--agent-host", "0.0.0.0"]) != 0
    assert "agent_host" in capsys.readouterr().err
