"""The model host: residency choice (pure) and `ModelHost` over scripted engines on a fake clock."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from edge.clock import ManualClock
from edge.contracts.engine import EngineState, Knobs
from edge.errors import ModelLoadError, ModelNotFound, ModelTooLarge
from edge.host.models import ModelHost
from edge.host.names import ModelNames
from edge.host.residency import ModelState, ModelView, RoomVerdict, plan_room, victim_for_memory
from edge.host.share import share_knobs
from tests.fakes import ScriptedEngine

MiB = 1 << 20


def view(key: str, mib: int, *, state: ModelState = ModelState.READY, leases: int = 0, used_s: float = 0.0,
         pinned: bool = False) -> ModelView:
    return ModelView(key, state, mib * MiB, leases, used_s, pinned)


# --- the residency choice ------------------------------------------------------------------------


def test_a_model_that_fits_beside_the_resident_ones_loads_without_unloading_any() -> None:
    room = plan_room([view("a", 400)], "b", 450 * MiB, 1300 * MiB)
    assert room.verdict is RoomVerdict.FITS and room.evict == ()


def test_idle_models_go_least_recently_used_first_and_only_as_many_as_needed() -> None:
    models = [view("a", 400, used_s=30.0), view("b", 400, used_s=10.0), view("c", 400, used_s=20.0)]
    room = plan_room(models, "d", 700 * MiB, 1300 * MiB)
    assert room.verdict is RoomVerdict.FITS
    assert room.evict == ("b", "c")  # 100 free + b 400 = 500 < 700; + c = 900


def test_a_pinned_or_busy_model_is_never_unloaded_for_room_the_load_waits() -> None:
    models = [view("a", 600, pinned=True, used_s=1.0), view("b", 600, leases=1, used_s=0.0)]
    room = plan_room(models, "c", 500 * MiB, 1300 * MiB)
    assert room.verdict is RoomVerdict.WAIT and room.evict == ()
    assert "a" in room.reason and "b" in room.reason


def test_a_load_in_flight_counts_against_the_budget() -> None:
    models = [view("a", 700, state=ModelState.LOADING)]
    assert plan_room(models, "b", 700 * MiB, 1300 * MiB).verdict is RoomVerdict.WAIT
    assert plan_room([view("a", 700, state=ModelState.COLD)], "b", 700 * MiB, 1300 * MiB).verdict \
        is RoomVerdict.FITS


def test_a_model_larger_than_the_whole_budget_is_refused_and_nothing_is_unloaded() -> None:
    room = plan_room([view("a", 100)], "big", 2000 * MiB, 1300 * MiB)
    assert room.verdict is RoomVerdict.TOO_LARGE and room.evict == ()


def test_under_a_memory_emergency_the_least_recently_used_idle_model_goes_pinned_last() -> None:
    models = [view("a", 100, used_s=1.0, pinned=True), view("b", 100, used_s=5.0),
              view("c", 100, used_s=3.0, leases=1)]
    assert victim_for_memory(models) == "b"
    assert victim_for_memory([view("a", 100, pinned=True)]) == "a"
    assert victim_for_memory([view("c", 100, leases=1)]) is None


def test_busy_models_split_the_threads_the_controller_allows() -> None:
    knobs = Knobs(active_limit=2, n_threads=4, duty=0.5, off_threads=2)
    assert share_knobs(knobs, 1) == knobs
    two = share_knobs(knobs, 2)
    assert (two.n_threads, two.off_threads, two.duty) == (2, 1, 0.5)
    assert share_knobs(Knobs(active_limit=2, n_threads=2), 3).n_threads == 1


# --- the host over scripted engines --------------------------------------------------------------

SIZES_MIB = {"smol": 400, "gemma": 470, "qwen": 750}


@dataclass(frozen=True)
class FakePlan:
    """What the host reads of a MemoryPlan."""

    total_bytes: int
    reserve_bytes: int
    fits: bool
    reason: str
    gpu_bytes: int


class Box:
    """A host over three scripted models; records every engine it builds."""

    def __init__(self, budget_mib: int = 1300, *, pins: tuple[str, ...] = (),
                 sizes: dict[str, int] | None = None, build_gate: threading.Event | None = None,
                 fail: set[str] | None = None) -> None:
        self.clock = ManualClock(100.0)
        self.sizes = sizes or SIZES_MIB
        self.engines: dict[str, ScriptedEngine] = {}
        self.gate, self.fail = build_gate, fail or set()
        self.max_held = 0
        names = ModelNames(lambda: [(k, Path(f"/store/{k}.gguf")) for k in self.sizes])
        self.host = ModelHost(names, budget_mib * MiB, plan=self.plan, build=self.build, n_slots=2,
                              knobs=Knobs(active_limit=2, n_threads=2), keep_alive_s=300.0, pins=pins,
                              clock=self.clock.monotonic)

    def plan(self, path: Path, budget: int) -> Any:
        need = self.sizes[path.stem] * MiB
        return FakePlan(total_bytes=need + 64 * MiB, reserve_bytes=64 * MiB, fits=need <= budget,
                        reason="" if need <= budget else "too large", gpu_bytes=0)

    def build(self, path: Path, plan: Any) -> ScriptedEngine:
        box = self

        class Engine(ScriptedEngine):
            def start(self) -> None:
                box.max_held = max(box.max_held, box.host.held_bytes())
                if box.gate is not None:
                    assert box.gate.wait(10)
                if path.stem in box.fail:
                    self.set_state(EngineState.FAILED)
                    raise ModelLoadError(str(path), "tensor data out of bounds")
                super().start()

        engine = Engine(model_name=path.stem, clock=self.clock)
        self.engines[path.stem] = engine
        return engine

    def use(self, name: str) -> None:
        self.host.acquire(name).release()
        self.clock.advance(1.0)
        self.max_held = max(self.max_held, self.host.held_bytes())


def test_requests_cycling_three_models_never_hold_more_than_the_budget() -> None:
    box = Box(1300)
    for name in ["smol", "gemma", "qwen"] * 3:
        box.use(name)
        resident = {h.ref.key for h in box.host.resident()}
        assert name in resident
    assert box.max_held <= 1300 * MiB
    assert {h.ref.key for h in box.host.resident()} == {"gemma", "qwen"}  # smol was least recent


def test_a_released_model_gets_its_keep_alive_back_and_a_leased_one_never_unloads_on_its_own() -> None:
    box = Box()
    lease = box.host.acquire("smol")
    engine = box.engines["smol"]
    assert engine.keep_alive_s is None  # held while leased
    lease.release()
    lease.release()  # idempotent
    assert engine.keep_alive_s == 300.0
    box.host.set_keep_alive("smol", 0.0)  # Ollama's keep_alive 0: the idle engine unloads now
    assert engine.state is EngineState.UNLOADED
    assert box.host.resident() == []  # an engine that unloaded itself no longer counts


def test_a_model_too_large_for_the_budget_is_refused_with_the_numbers_and_nothing_unloads() -> None:
    box = Box(1300, sizes={"smol": 400, "huge": 2000})
    box.use("smol")
    with pytest.raises(ModelTooLarge) as err:
        box.host.acquire("huge")
    assert err.value.need_bytes == 2000 * MiB and err.value.budget_bytes == 1300 * MiB
    assert [h.ref.key for h in box.host.resident()] == ["smol"]


def test_an_unknown_name_is_a_404_naming_the_closest_models() -> None:
    box = Box()
    with pytest.raises(ModelNotFound) as err:
        box.host.acquire("gema")
    assert "gemma" in str(err.value)
    assert box.host.acquire("qwen:latest").model.ref.key == "qwen"  # Ollama's tag


def test_a_busy_model_is_not_unloaded_the_load_waits_until_it_is_released() -> None:
    box = Box(1300)
    held = [box.host.acquire("qwen"), box.host.acquire("gemma")]  # 1220 MiB, both busy
    got: list[str] = []
    waiter = threading.Thread(target=lambda: got.append(box.host.acquire("smol").model.ref.key))
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive() and not got  # waiting: nothing idle to unload
    assert box.engines["qwen"].state is EngineState.READY
    held[0].release()
    waiter.join(10)
    assert got == ["smol"]
    assert box.engines["qwen"].state is EngineState.UNLOADED
    assert box.host.held_bytes() <= 1300 * MiB


def test_two_loads_at_once_never_race_past_the_budget() -> None:
    gate = threading.Event()
    box = Box(1300, build_gate=gate)
    threads = [threading.Thread(target=box.use, args=(n,)) for n in ("qwen", "gemma", "smol")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(0.1)
    assert box.host.held_bytes() <= 1300 * MiB  # the loads in flight are counted
    gate.set()
    for t in threads:
        t.join(10)
    assert not any(t.is_alive() for t in threads)
    assert box.max_held <= 1300 * MiB


def test_a_model_that_fails_to_load_is_named_and_the_others_keep_serving() -> None:
    box = Box(fail={"gemma"})
    box.use("smol")
    with pytest.raises(ModelLoadError, match="out of bounds"):
        box.host.acquire("gemma")
    status = {s["model"]: s for s in box.host.status()}
    assert status["gemma"]["state"] == "failed" and "out of bounds" in status["gemma"]["error"]
    box.use("smol")
    assert status["smol"]["state"] == "ready"


def test_pinned_models_stay_resident_and_models_busy_at_once_share_the_threads() -> None:
    box = Box(1300, pins=("smol",))
    box.use("smol")
    box.use("gemma")
    box.use("qwen")  # needs 750: gemma goes, smol is pinned
    assert {h.ref.key for h in box.host.resident()} == {"smol", "qwen"}
    a, b = box.host.acquire("smol"), box.host.acquire("qwen")
    assert box.engines["smol"].knobs.n_threads == 1 and box.engines["qwen"].knobs.n_threads == 1
    a.release()
    assert box.engines["qwen"].knobs.n_threads == 2
    b.release()
    box.host.apply(Knobs(active_limit=1, n_threads=1, duty=0.5))
    assert box.engines["qwen"].knobs.duty == 0.5  # the controller's decision holds for every model
    assert box.host.stats().n_slots == 4  # two resident engines' slots, summed


def test_the_scheduler_eviction_unloads_the_least_recently_used_idle_model() -> None:
    box = Box(1300)
    box.use("smol")
    box.use("gemma")
    assert box.host.unload() is True
    assert {h.ref.key for h in box.host.resident()} == {"gemma"}
    assert box.host.unload_model("gemma") is True
    assert box.host.state is EngineState.UNLOADED  # nothing resident: ready to load on demand


def test_the_host_reports_a_load_in_flight_to_the_memory_guard() -> None:
    gate = threading.Event()
    box = Box(1300, build_gate=gate)
    loader = threading.Thread(target=box.use, args=("qwen",))
    loader.start()
    loader.join(0.2)
    assert box.host.stats().loading_bytes == 750 * MiB and box.host.state is EngineState.LOADING
    gate.set()
    loader.join(10)
    assert box.host.stats().loading_bytes == 0 and box.host.state is EngineState.READY
