"""Memory guard: KV fit, reserve, PSI thresholds with hysteresis, shedding, eviction."""

from __future__ import annotations

from dataclasses import replace

import pytest

from edge.errors import InsufficientMemory, KvCacheFull
from edge.runtime.types import EngineStats, Knobs
from edge.scheduler.memory import (
    check_fits,
    free_kv_cells,
    memory_mode,
    psi_easing,
    should_evict,
)
from edge.scheduler.state import ControlInput, ControllerConfig, MemoryMode
from edge.telemetry.sample import PressureLevel
from tests.fakes import engine_stats

MiB = 1 << 20
CFG = ControllerConfig(reserve_bytes=1024 * MiB, psi_some_pause_pct=10.0, psi_full_shed_pct=2.0)


def stats(used: int, total: int = 4096) -> EngineStats:
    return engine_stats(step_time_s=0.05, decode_time_s=0.05, kv_cells_used=used, kv_cells_total=total,
                        n_slots=4, knobs=Knobs(4, 2))


def mode(prev: MemoryMode = MemoryMode.OK, **kw: object) -> MemoryMode:
    return memory_mode(ControlInput(t_s=0.0, **kw), prev, CFG)[0]  # type: ignore[arg-type]


def test_thresholds() -> None:
    assert mode(mem_available_bytes=4096 * MiB, psi_some_avg10=0.5, psi_full_avg10=0.0) is MemoryMode.OK
    assert mode(psi_some_avg10=10.0) is MemoryMode.TIGHT
    assert mode(psi_some_avg10=9.9) is MemoryMode.OK
    assert mode(psi_full_avg10=2.0) is MemoryMode.SHED
    assert mode(mem_available_bytes=1200 * MiB) is MemoryMode.TIGHT  # within 25 % of the reserve
    assert mode(mem_available_bytes=1000 * MiB) is MemoryMode.SHED  # below the reserve
    assert mode(memory_pressure=PressureLevel.HEAVY) is MemoryMode.TIGHT
    assert mode(memory_pressure=PressureLevel.CRITICAL) is MemoryMode.SHED
    assert mode() is MemoryMode.OK  # memory telemetry unknown: the KV check still guards admission


def test_hysteresis_on_the_way_back() -> None:
    assert mode(MemoryMode.SHED, psi_full_avg10=1.5) is MemoryMode.SHED  # above half of 2 %
    assert mode(MemoryMode.SHED, psi_full_avg10=0.5, psi_some_avg10=6.0) is MemoryMode.TIGHT
    assert mode(MemoryMode.TIGHT, psi_some_avg10=6.0) is MemoryMode.TIGHT
    assert mode(MemoryMode.TIGHT, psi_some_avg10=4.0) is MemoryMode.OK
    assert mode(MemoryMode.TIGHT, mem_available_bytes=1400 * MiB) is MemoryMode.TIGHT  # < 1.5 x reserve
    assert mode(MemoryMode.TIGHT, mem_available_bytes=1600 * MiB) is MemoryMode.OK


def test_psi_averages_that_only_trail_a_past_hog_do_not_hold_admission() -> None:
    """avg10 lags ~30 s after a hog exits; with memory back and PSI not rising, admission reopens."""
    plenty, short = 4096 * MiB, 1100 * MiB
    after_hog = {"psi_some_avg10": 40.0, "psi_full_avg10": 12.0}
    prev = (53.0, 15.6)
    inp = ControlInput(t_s=0.0, mem_available_bytes=plenty, **after_hog)  # type: ignore[arg-type]
    assert psi_easing(inp, prev, CFG.reserve_bytes, short_recently=True)
    got, why = memory_mode(inp, MemoryMode.SHED, CFG, prev, short_recently=True)
    assert got is MemoryMode.OK and "trail" in why
    # equal readings (the kernel refreshes avg10 every 2 s) are not rising
    assert memory_mode(inp, MemoryMode.SHED, CFG, (40.0, 12.0), short_recently=True)[0] is MemoryMode.OK
    # without the easing the same reading keeps shedding
    assert memory_mode(inp, MemoryMode.SHED, CFG)[0] is MemoryMode.SHED
    # memory never short (page-cache thrashing hides behind MemAvailable): full hysteresis
    assert memory_mode(inp, MemoryMode.SHED, CFG, prev, short_recently=False)[0] is MemoryMode.SHED
    # rising PSI, memory still short, or no earlier reading: PSI counts
    assert memory_mode(inp, MemoryMode.SHED, CFG, (30.0, 10.0), short_recently=True)[0] is MemoryMode.SHED
    short_inp = ControlInput(t_s=0.0, mem_available_bytes=short, **after_hog)  # type: ignore[arg-type]
    assert not psi_easing(short_inp, prev, CFG.reserve_bytes, short_recently=True)
    assert memory_mode(short_inp, MemoryMode.SHED, CFG, prev, short_recently=True)[0] is MemoryMode.SHED
    no_avail = ControlInput(t_s=0.0, **after_hog)  # type: ignore[arg-type]
    assert not psi_easing(no_avail, prev, CFG.reserve_bytes, short_recently=True)
    assert not psi_easing(inp, (None, None), CFG.reserve_bytes, short_recently=True)


def test_eviction_gives_the_model_memory_back_before_the_oom_killer() -> None:
    """Shedding frees nothing (llama.cpp commits its KV cache at load): deep or fast shortages unload."""
    def ev(avail_mib: int, prev: tuple[float, int] | None = None, evicted: bool = False,
           mode_: MemoryMode = MemoryMode.SHED, cfg: ControllerConfig = CFG, **kw: object) -> bool:
        inp = ControlInput(t_s=10.0, mem_available_bytes=avail_mib * MiB, **kw)  # type: ignore[arg-type]
        return should_evict(inp, mode_, prev, evicted, cfg)[0]

    assert not ev(900)  # below the 1024 MiB reserve but steady: shed background, keep the model
    assert ev(500)  # under half the reserve
    assert ev(900, prev=(9.0, 1200 * MiB))  # falling 300 MiB/s: half the reserve within 10 s
    assert not ev(900, prev=(9.0, 920 * MiB))  # falling slowly
    assert ev(900, psi_full_avg10=12.0) and not ev(900, psi_full_avg10=5.0)
    assert not ev(2000, prev=(9.0, 6000 * MiB), mode_=MemoryMode.TIGHT)  # not below the reserve yet
    assert not ev(900, mode_=MemoryMode.TIGHT)
    assert not should_evict(ControlInput(t_s=1.0), MemoryMode.SHED, None, False, CFG)[0]  # unknown
    # once evicted it stays so until memory is back with room for the model above the release level
    big = replace(CFG, footprint_bytes=512 * MiB)
    assert ev(1200, evicted=True, mode_=MemoryMode.TIGHT)
    assert not ev(1600, evicted=True, mode_=MemoryMode.OK)
    assert ev(1600, evicted=True, mode_=MemoryMode.OK, cfg=big)  # 1536 + 512 MiB needed
    assert not ev(2100, evicted=True, mode_=MemoryMode.OK, cfg=big)


def test_kv_fit_counts_reservations_once() -> None:
    st = stats(used=1000)
    assert free_kv_cells(st, reserved_cells=600) == 4096 - 1000
    assert free_kv_cells(st, reserved_cells=3000) == 4096 - 3000
    check_fits(1000, 2000, st, reserved_cells=1000, mem_available_bytes=None, reserve_bytes=0)
    with pytest.raises(KvCacheFull) as exc:
        check_fits(1000, 2200, st, reserved_cells=1000, mem_available_bytes=None, reserve_bytes=0,
                   retry_after_s=7.5)
    assert exc.value.need_cells == 3200 and exc.value.free_cells == 3096 and exc.value.retry_after_s == 7.5


def test_request_larger_than_the_cache_is_refused_for_good() -> None:
    with pytest.raises(InsufficientMemory) as exc:
        check_fits(4000, 200, stats(0), reserved_cells=0, mem_available_bytes=None, reserve_bytes=0)
    assert "KV cache" in exc.value.what


def test_system_memory_reserve_when_kv_commits_lazily() -> None:
    per_cell = 100_000
    check_fits(100, 100, stats(0), 0, mem_available_bytes=1100 * MiB, reserve_bytes=1024 * MiB,
               kv_bytes_per_cell=per_cell)  # 200 cells = 19 MiB: still above the reserve
    with pytest.raises(InsufficientMemory) as exc:
        check_fits(500, 500, stats(0), 0, mem_available_bytes=1100 * MiB, reserve_bytes=1024 * MiB,
                   kv_bytes_per_cell=per_cell)  # 95 MiB would dip below it
    assert exc.value.available_bytes == 1100 * MiB

