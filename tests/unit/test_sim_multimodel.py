"""`edge sim`'s two-model scenario (chat+embed-hot): one controller for both resident models.

A chat model and an embedding model on a hot Orin Nano. Under edge's policy the model host
splits the box's knobs between the busy models (`edge.host.share.share_knobs`), so the two
never run more threads than the controller allows and the box stays under its trip point;
the chat keeps answering beside the background embeddings. All in simulated time.
"""

from __future__ import annotations

import argparse

import pytest

from edge.commands import sim as sim_cmd
from edge.config import load_profile
from edge.contracts.engine import Knobs, Priority
from edge.host.share import share_knobs
from edge.sim import multimodel
from edge.sim.device import DeviceLoad, SimulatedDevice
from edge.sim.engine import CONTENDED_SPEED, SimEngine
from edge.sim.harness import SCENARIOS, run_scenario
from edge.sim.metrics import RunMetrics
from edge.sim.multimodel import SimEmbedEngine, SimHost
from edge.sim.throughput import ThroughputModel, load_throughput
from edge.sim.workloads import Client, EmbedClient, SimRequest

PROFILE = "jetson-orin-nano"
SCENARIO = "chat+embed-hot"
SHORT_S = 600.0
POLICIES = ("none", "threshold", "edge")


@pytest.fixture(scope="module")
def tp() -> ThroughputModel:
    return load_throughput()


@pytest.fixture(scope="module")
def runs(tp: ThroughputModel) -> dict[str, RunMetrics]:
    return {p: run_scenario(SCENARIO, p, PROFILE, tp, duration_s=SHORT_S) for p in POLICIES}


def _chat_done(m: RunMetrics) -> int:
    return m.completed - m.extra["embed_requests"]


def test_edge_holds_both_models_to_one_allowance_and_the_box_under_its_trip(
        runs: dict[str, RunMetrics], tp: ThroughputModel) -> None:
    edge, none = runs["edge"], runs["none"]
    limit = load_profile(PROFILE).thermal_limit_c
    # the scenario has teeth: each model at the box's full knobs, 2 + 2 threads on 2 cores, throttles
    assert none.seconds_hw_throttled > 0 and none.max_temp_c >= limit - 0.5
    assert none.extra["threads_over_allowance_s"] > 0
    assert none.extra["max_threads_in_use"] == 2 * tp.max_threads
    # edge: the two models really ran at once, and together never beyond the controller's threads
    assert edge.extra["both_busy_s"] >= 60.0
    assert edge.extra["threads_over_allowance_s"] == 0 and edge.extra["max_threads_in_use"] <= tp.max_threads
    assert edge.max_temp_c < limit - 3.0 and edge.seconds_above_limit_minus_3 == 0
    assert edge.seconds_hw_throttled == 0 and edge.oom_events == 0 and edge.lost_without_error == 0


def test_the_chat_keeps_being_served_beside_the_background_embeddings(runs: dict[str, RunMetrics]) -> None:
    edge = runs["edge"]
    assert _chat_done(edge) >= 50 and edge.tokens > max(runs["none"].tokens, runs["threshold"].tokens)
    assert all(_chat_done(edge) > _chat_done(runs[p]) for p in ("none", "threshold"))
    ttft, alone = edge.interactive_p99_ttft_s, edge.extra["unloaded_interactive_p99_ttft_s"]
    assert ttft is not None and alone is not None
    assert ttft < min(runs[p].interactive_p99_ttft_s or 0.0 for p in ("none", "threshold"))
    assert ttft <= 2.5 * alone  # the chat beside the embeddings vs with the embedding model idle
    # background, not starved: the indexer's embeddings progress, some refused with Retry-After when hot
    assert edge.extra["embed_inputs"] >= runs["none"].extra["embed_inputs"] > 0


def test_without_the_hosts_share_the_two_models_take_more_threads_than_allowed(
        runs: dict[str, RunMetrics], tp: ThroughputModel, monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks above have teeth: skip `share_knobs` and the models run 2 + 2 threads on 2
    cores; the controller still holds the heat, but the chat waits behind the contention."""
    monkeypatch.setattr(multimodel, "share_knobs", lambda knobs, n_busy: knobs)
    m = run_scenario(SCENARIO, "edge", PROFILE, tp, duration_s=SHORT_S)
    assert m.extra["threads_over_allowance_s"] > 0 and m.extra["max_threads_in_use"] > tp.max_threads
    shared = runs["edge"]
    assert m.interactive_p99_ttft_s is not None and shared.interactive_p99_ttft_s is not None
    assert m.interactive_p99_ttft_s > 1.3 * shared.interactive_p99_ttft_s
    assert m.extra["embed_inputs"] < shared.extra["embed_inputs"] and m.tokens < shared.tokens


def test_runs_are_deterministic(tp: ThroughputModel) -> None:
    a = run_scenario(SCENARIO, "edge", PROFILE, tp, duration_s=300.0, seed=3)
    b = run_scenario(SCENARIO, "edge", PROFILE, tp, duration_s=300.0, seed=3)
    assert a.as_dict() == b.as_dict() and a.extra["embed_inputs"] > 0


def _embed_request(rid: int, tokens: int, inputs: int = 4) -> SimRequest:
    client = EmbedClient("indexer", Priority.BACKGROUND, (1, 1), (0, 0), inputs=inputs)
    return SimRequest(rid, client, Priority.BACKGROUND, tokens, 0, 0.0, inputs=inputs)


def test_the_host_splits_the_box_among_busy_models_only(tp: ThroughputModel) -> None:
    chat = SimEngine(tp, 2, Knobs(2, 2), model_bytes=0, kv_bytes_per_cell=0, kv_cells_total=1 << 16)
    host = SimHost.beside(chat, 0, 0, share=True)
    box = Knobs(2, 2, 0.5)
    host.apply(box)
    user = Client("c", Priority.INTERACTIVE, (1, 1), (400, 400))
    host.submit(SimRequest(1, user, Priority.INTERACTIVE, 20, 400, 0.0))
    host.step(0.0, 0.25, 1.0, 2.0)
    assert host.chat.knobs == box and host.embed.knobs == box  # one busy model: the whole box
    host.submit(_embed_request(2, 10_000))
    host.step(0.25, 0.25, 1.0, 2.0)
    assert host.chat.knobs == host.embed.knobs == share_knobs(box, 2) and host.chat.knobs.n_threads == 1
    assert host.chat.knobs.duty == host.embed.knobs.duty == 0.5
    assert [ld.threads for ld in host.loads()] == [1, 1] and all(ld.duty == 0.5 for ld in host.loads())
    stats = host.stats()
    assert stats.knobs == box and stats.active == 1  # one engine to the scheduler: the box's knobs


def test_an_embedding_costs_its_tokens_at_the_measured_prompt_rate(tp: ThroughputModel) -> None:
    def seconds(knobs: Knobs, free_cores: float) -> float:
        eng = SimEmbedEngine(tp, knobs, 0, 0)
        eng.submit(_embed_request(1, round(2.0 * tp.prefill_tokens_per_s(2))))  # 2 s at full speed
        for i in range(400):
            if eng.step(0.25 * i, 0.25, 1.0, free_cores):
                assert eng.inputs == 4 and eng.requests == 1
                return 0.25 * (i + 1)
        raise AssertionError("never finished")

    assert seconds(Knobs(1, 2), 2.0) == pytest.approx(2.0, abs=0.25)
    assert seconds(Knobs(1, 2, 0.5), 2.0) == pytest.approx(4.0, abs=0.25)  # the duty cycle holds it too
    assert seconds(Knobs(1, 2), 0.0) == pytest.approx(2.0 / CONTENDED_SPEED, abs=0.25)  # cores taken


def test_the_device_heats_with_both_models_work(tp: ThroughputModel) -> None:
    dev = SimulatedDevice(load_profile(PROFILE), tp)
    dev.set_loads([DeviceLoad(1, 1, 1.0)])
    one = dev.utilisation
    dev.set_loads([DeviceLoad(1, 1, 1.0), DeviceLoad(tp.max_sequences, 1, 1.0)])
    assert dev.utilisation == pytest.approx(one + tp.utilisation(tp.max_sequences, 1, 1.0)) and one > 0
    dev.set_loads([DeviceLoad(8, 2, 1.0), DeviceLoad(8, 2, 1.0)])
    assert dev.utilisation == 1.0  # the box cannot be busier than all its cores


def test_edge_sim_lists_and_prints_the_scenario(capsys: pytest.CaptureFixture[str]) -> None:
    assert SCENARIOS[SCENARIO].embed_model
    parser = argparse.ArgumentParser()
    sim_cmd.register(parser.add_subparsers())
    args = parser.parse_args(["sim", "--list"])
    assert args.func(args) == 0
    assert any(line.startswith(SCENARIO + " ") for line in capsys.readouterr().out.splitlines())
    args = parser.parse_args(["sim", "--duration-s", "120", "--scenario", SCENARIO, "--policy", "edge"])
    assert args.func(args) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[-2:] == ["embed_in", "s_thr>allow"]
    assert table[1].split()[1:3] == [SCENARIO, "edge"]
