"""Start-up probes over fakes: nothing measured before ready, answers kept per model, build and
threads and read back instead of measured, idle work that yields one decode at a time."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from edge.clock import ManualClock
from edge.runtime.engine.startup import IdleWork, Startup
from edge.runtime.kv.residency import LoadSpec
from edge.runtime.llama.probe_cache import ProbeCache, probe_key
from edge.runtime.spec import calibration
from edge.runtime.spec.state import Speculation
from edge.runtime.step.slots import Slot

CURVE = {1: 0.010, 2: 0.011, 3: 0.013, 4: 0.012}


@dataclass
class _Batch:
    capacity: int = 512


@dataclass
class _Ctx:
    primed: tuple[int, ...] = ()
    settled: int = 0

    def settle(self) -> None:
        self.settled += 1


@dataclass
class _Live:
    model: object = "weights"
    ctx: _Ctx = field(default_factory=_Ctx)
    batch: _Batch = field(default_factory=_Batch)
    n_ctx_seq: int = 1024


class FakeResidency:
    def __init__(self, model_path: Path, attention_owed: bool = False) -> None:
        self.spec = LoadSpec(str(model_path), 1024, 512, 2, "f16")
        self.loaded = True
        self.live = _Live()
        self.flash_attn: bool | None = None
        self.warmed = 0
        self.owed = attention_owed
        self.attention_decodes = 0
        self.vocab_made = False

    def warm_up(self) -> None:
        self.warmed += 1

    def attention_owed(self) -> bool:
        return self.owed

    def attention_steps(self, n_threads: int) -> Iterator[None]:
        for _ in range(3):
            yield
            self.attention_decodes += 1
        self.owed, self.flash_attn = False, False
        return True

    def context_config(self, n_threads: int) -> str:
        return f"ctx threads={n_threads} fa={self.flash_attn}"

    def vocab_steps(self) -> Iterator[None]:
        yield
        self.vocab_made = True


class FakeLoop:
    def __init__(self, k: int = 3) -> None:
        self.spec = Speculation("ngram", k)
        self.replaced = 0
        self.published = 0
        self.slots = [Slot(0), Slot(1)]

    def context_replaced(self) -> None:
        self.replaced += 1

    def publish(self, *_a: object) -> None:
        self.published += 1


class Measure:
    """A fake curve probe: one 'decode' per yield, recorded."""

    def __init__(self) -> None:
        self.decodes: list[int] = []
        self.configs: list[object] = []

    def __call__(self, model: object, cfg: object, n_max: int, out: dict[int, float]) -> Iterator[None]:
        self.configs.append(cfg)
        for n in range(1, n_max + 1):
            if n in out:
                continue
            yield
            self.decodes.append(n)
            out[n] = CURVE[n]


def _model(tmp_path: Path) -> Path:
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF" + b"\0" * 60)
    return path


def _startup(tmp_path: Path, model: Path, *, threads: int = 2, build: str = "b1",
             attention_owed: bool = False) -> tuple[Startup, FakeResidency, FakeLoop, Measure]:
    res, loop, measure = FakeResidency(model, attention_owed), FakeLoop(), Measure()
    st = Startup(res, loop, threads, cache=ProbeCache(calibration.KIND, tmp_path / "cache"),  # type: ignore[arg-type]
                 build=lambda: build, measure_curve=measure)  # type: ignore[arg-type]
    return st, res, loop, measure


def _drain(st: Startup, limit: int = 100) -> int:
    turns = 0
    while st.idle.owed and turns < limit:
        st.idle.step()
        turns += 1
    return turns


def test_nothing_is_measured_before_ready_and_the_curve_comes_in_idle_turns(tmp_path: Path) -> None:
    st, res, loop, measure = _startup(tmp_path, _model(tmp_path))
    st.before_ready()
    assert res.warmed == 1  # the warm-up is the one decode the first request would pay for anyway
    assert measure.decodes == [] and loop.spec.cost.by_n == {}  # no probe before ready
    assert st.idle.names == ["verify-cost calibration", "vocabulary-only model"]
    st.idle.step()
    assert measure.decodes == []  # the first slice makes the context; each later one decodes once
    st.idle.step()
    assert measure.decodes == [1]
    _drain(st)
    assert measure.decodes == [1, 2, 3, 4] and loop.spec.cost.by_n == CURVE  # k=3: verify steps of 1..4
    assert st.idle.done == ["verify-cost calibration", "vocabulary-only model"] and res.vocab_made


def test_a_second_start_with_the_same_key_reads_the_curve_instead_of_measuring(tmp_path: Path) -> None:
    model = _model(tmp_path)
    first, *_ = _startup(tmp_path, model)
    first.before_ready()
    _drain(first)
    again, _res, loop, measure = _startup(tmp_path, model)
    again.before_ready()
    assert again.idle.names == ["vocabulary-only model"] and measure.decodes == []
    assert loop.spec.cost.by_n == CURVE  # there from the first request on
    doc = json.loads((tmp_path / "cache" / "verify_cost.json").read_text())
    assert len(doc) == 1


def test_another_thread_count_build_or_model_file_is_measured_again(tmp_path: Path) -> None:
    model = _model(tmp_path)
    first, *_ = _startup(tmp_path, model)
    first.before_ready()
    _drain(first)
    for kw in ({"threads": 1}, {"build": "b2"}):
        st, _res, _loop, measure = _startup(tmp_path, model, **kw)  # type: ignore[arg-type]
        st.before_ready()
        assert "verify-cost calibration" in st.idle.names
        _drain(st)
        assert measure.decodes == [1, 2, 3, 4], kw
    st = os.stat(model)
    os.utime(model, (st.st_atime, st.st_mtime + 10))  # the file was replaced
    changed, _res, _loop, measure = _startup(tmp_path, model)
    changed.before_ready()
    assert "verify-cost calibration" in changed.idle.names
    doc = json.loads((tmp_path / "cache" / "verify_cost.json").read_text())
    assert len(doc) == 3


def test_the_attention_probe_goes_first_and_the_curve_is_kept_for_the_kind_it_chose(tmp_path: Path) -> None:
    st, res, loop, measure = _startup(tmp_path, _model(tmp_path), attention_owed=True)
    st.before_ready()
    assert res.attention_decodes == 0 and measure.decodes == []
    _drain(st)
    assert st.idle.done == ["attention probe", "verify-cost calibration", "vocabulary-only model"]
    assert res.attention_decodes == 3 and loop.replaced == 1  # the other kind won: caches forgotten
    assert measure.configs == ["ctx threads=2 fa=False"]  # timed with the chosen kind
    again, _res, _loop, measure = _startup(tmp_path, _model(tmp_path))
    again.res.flash_attn = False  # type: ignore[attr-defined]  # the next start opens with the verdict
    again.before_ready()
    assert again.idle.names == ["vocabulary-only model"] and measure.decodes == []


def test_a_suspended_calibration_resumes_where_it_stopped(tmp_path: Path) -> None:
    st, _res, loop, measure = _startup(tmp_path, _model(tmp_path))
    st.before_ready()
    for _ in range(3):
        st.idle.step()
    assert measure.decodes == [1, 2]
    st.idle.suspend()  # an unload: the probe's context goes before the weights
    assert st.idle.names[0] == "verify-cost calibration" and loop.spec.cost.by_n == {}
    _drain(st)
    assert measure.decodes == [1, 2, 3, 4]  # 1 and 2 not measured twice
    assert loop.spec.cost.by_n == CURVE


def test_what_the_steps_measured_themselves_stands(tmp_path: Path) -> None:
    st, _res, loop, _measure = _startup(tmp_path, _model(tmp_path))
    loop.spec.cost.observe(1, 0.020)  # a real step came first
    st.before_ready()
    _drain(st)
    assert loop.spec.cost.by_n[1] == 0.020 and loop.spec.cost.by_n[2] == CURVE[2]


def test_probes_wait_for_the_engine_to_be_idle_for_the_grace(tmp_path: Path) -> None:
    clock = ManualClock()
    res, loop = FakeResidency(_model(tmp_path)), FakeLoop()
    st = Startup(res, loop, 2, clock=clock, cache=ProbeCache(calibration.KIND, tmp_path),  # type: ignore[arg-type]
                 build=lambda: "b1", measure_curve=Measure(), grace_s=0.5)  # type: ignore[arg-type]
    clock.advance(10.0)  # a long load
    st.before_ready()
    assert st.grace_left_s(last_work_s=0.0) == 0.5  # counted from ready, not from the load's start
    clock.advance(0.5)
    assert st.grace_left_s(last_work_s=0.0) <= 0
    assert st.grace_left_s(last_work_s=clock.monotonic() - 0.2) == pytest.approx(0.3)  # a request just ended


def test_idle_work_yields_between_decodes_and_a_failure_only_drops_the_task() -> None:
    work, ran = IdleWork(), []

    def task(name: str, n: int, fail: bool = False) -> Iterator[None]:
        for i in range(n):
            yield
            ran.append(f"{name}{i}")
        if fail:
            raise RuntimeError("llama_decode failed")

    work.add("a", lambda: task("a", 2, fail=True))
    work.add("b", lambda: task("b", 1))
    steps = 0
    while work.owed:
        work.step()
        steps += 1
    assert ran == ["a0", "a1", "b0"] and work.done == ["b"] and steps == 5


def test_probe_keys_and_a_bad_cache_file(tmp_path: Path) -> None:
    model = _model(tmp_path)
    key = probe_key(str(model), "b1", 2, "x")
    assert key == probe_key(str(model), "b1", 2, "x")
    assert len({key, probe_key(str(model), "b2", 2, "x"), probe_key(str(model), "b1", 1, "x"),
                probe_key(str(model), "b1", 2, "y")}) == 4
    cache = ProbeCache("kind", tmp_path)
    assert cache.load(key) is None
    cache.save(key, {"a": 1})
    assert cache.load(key) == {"a": 1}
    cache.path.write_text("[1, 2]")  # not a table: measured again, never a crash
    assert cache.load(key) is None
    cache.save(key, {"a": 2})
    assert cache.load(key) == {"a": 2}
    assert calibration.curve_from_row({"by_n": {"1": 0.1, "2": -1}}, 2) is None  # incomplete: re-measured
    assert calibration.curve_from_row({"by_n": {"1": 0.1}}, 2) is None
    assert calibration.curve_from_row({"by_n": {"1": 0.1, "2": 0.2}}, 2) == {1: 0.1, 2: 0.2}


def test_the_engine_thread_is_ready_first_and_a_request_at_ready_finds_no_probe_in_its_way() -> None:
    import threading

    from edge.runtime.engine.mailbox import Mailbox
    from edge.runtime.engine.thread import EngineThread
    from edge.runtime.step.loop import StepLoop
    from edge.runtime.types import EngineState, FinishReason, Knobs
    from tests.unit.test_steploop import EOS, FakeBatch, FakeCtx, _seq
    from tests.unit.test_steploop import FakeResidency as LoopResidency

    class ThreadResidency(LoopResidency):
        last_active_s = 0.0

        def keep_alive_due(self, idle: bool) -> bool:
            return False

        def idle_wait_s(self) -> float | None:
            return None

        def warm_up(self) -> None:
            pass

        def attention_owed(self) -> bool:
            return False

        def vocab_steps(self) -> Iterator[None]:
            return iter(())

    clock = ManualClock()
    res = ThreadResidency(FakeCtx(), FakeBatch())
    box = Mailbox(Knobs(2, 2))
    box.set_state(EngineState.READY)
    loop = StepLoop(box, res, clock, 2, 8)  # type: ignore[arg-type]
    startup = Startup(res, loop, 2, clock=clock, grace_s=0.5)  # type: ignore[arg-type]
    body = EngineThread(box, res, loop, clock, startup)  # type: ignore[arg-type]
    seen: list[tuple[bool, float]] = []

    def probe() -> Iterator[None]:
        for _ in range(2):
            yield
            seen.append((body.ready.is_set(), clock.monotonic()))

    startup.idle.add("probe", probe)
    thread = threading.Thread(target=body.run, name="edge-engine", daemon=True)
    thread.start()
    try:
        assert body.ready.wait(10.0)
        seq = _seq([10, 11, 12], [5, EOS])
        box.post(seq)  # sent as soon as ready said so
        events = list(seq.handle)
        assert events[-1].finish_reason is FinishReason.STOP
        assert seen == [] and startup.idle.owed  # no probe before the request, nor right after it
        clock.advance(0.5)
        box.wake()
        assert startup.idle.finished.wait(10.0)
        assert seen == [(True, 0.5), (True, 0.5)]  # after ready, once the engine idled for the grace
    finally:
        box.ask_stop()
        thread.join(10.0)


def test_the_chat_head_primed_before_the_engine_had_the_context_is_slot_0s_prompt_cache(
        tmp_path: Path) -> None:
    st, res, loop, _ = _startup(tmp_path, _model(tmp_path))
    ctx = res.live.ctx
    ctx.primed = (1, 7, 7, 9, 4)  # what llama/prime.py left in sequence 0
    st.before_ready()
    assert res.warmed == 1 and loop.slots[0].tokens == [1, 7, 7, 9, 4] and loop.slots[1].tokens == []
    assert ctx.settled == 1  # waited for the early thread's priming before reading it
    assert ctx.primed == ()  # the slot owns those cells now: a second start-up adopts nothing
    loop.slots[0].tokens.clear()
    st.before_ready()
    assert loop.slots[0].tokens == []


def test_nothing_primed_leaves_every_slot_empty(tmp_path: Path) -> None:
    st, res, loop, _ = _startup(tmp_path, _model(tmp_path))
    res.loaded = False  # e.g. loaded lazily: no context yet
    st.before_ready()
    assert all(s.tokens == [] for s in loop.slots)
