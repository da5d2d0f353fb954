"""Memory guard: when to stop admitting, when to shed, when to evict, whether a request fits, when to unload.

Thresholds follow the design notes (inferred, tunable in ControllerConfig):
PSI `some avg10` >= 10 % or MemAvailable near the reserve pauses admission;
PSI `full avg10` >= 2 % or MemAvailable below the reserve sheds background
work. Leaving a state needs the signal to fall well below its threshold
(hysteresis), so admission does not flap.
"""

from __future__ import annotations

from dataclasses import dataclass

from edge.contracts.engine import EngineStats
from edge.errors import InsufficientMemory, KvCacheFull
from edge.scheduler.state import ControlInput, ControllerConfig, ControllerState, MemoryMode
from edge.telemetry.sample import PressureLevel

TIGHT_RESERVE_FACTOR = 1.25  # available below reserve x this: stop admitting
RELEASE_RESERVE_FACTOR = 1.5  # available above reserve x this: admitting again
EVICT_RESERVE_FACTOR = 0.5  # below reserve x this: unload the model (memory emergency)
EVICT_HORIZON_S = 10.0  # ... or when MemAvailable would get there within this time
PSI_FULL_EVICT_PCT = 10.0  # ... or PSI full avg10 this high while below the reserve
PSI_TRAIL_S = 60.0  # how long avg10 can trail a shortage that is over (3 x its 10 s window, rounded up)


PsiPair = tuple[float | None, float | None]  # (some avg10, full avg10)


def psi_easing(inp: ControlInput, prev_psi: PsiPair, reserve_bytes: int, short_recently: bool) -> bool:
    """True when PSI only reports stalls of a memory shortage that is over.

    avg10 is a 10 s trailing average: after a memory hog exits it stays above
    the thresholds for ~30 s while nothing stalls any more. When MemAvailable
    was short within the last `PSI_TRAIL_S` and is now back above the release
    level, and neither average is rising (the kernel refreshes them every 2 s,
    so equal readings count as not rising), they no longer hold admission
    closed. PSI with plenty of MemAvailable all along (page-cache thrashing,
    which MemAvailable hides) keeps its full hysteresis, as does rising PSI.
    """
    avail = inp.mem_available_bytes
    if not short_recently or avail is None or avail < reserve_bytes * RELEASE_RESERVE_FACTOR:
        return False
    pairs = [(now, before) for now, before in zip((inp.psi_some_avg10, inp.psi_full_avg10), prev_psi,
                                                  strict=True) if now is not None]
    return bool(pairs) and all(before is not None and now <= before for now, before in pairs)


def memory_short(inp: ControlInput, reserve_bytes: int) -> bool:
    """MemAvailable within the tight band of the reserve (the controller remembers when)."""
    avail = inp.mem_available_bytes
    return avail is not None and avail < reserve_bytes * TIGHT_RESERVE_FACTOR


def memory_mode(inp: ControlInput, prev: MemoryMode, cfg: ControllerConfig,
                prev_psi: PsiPair = (None, None), short_recently: bool = False) -> tuple[MemoryMode, str]:
    """Memory state with hysteresis, and why; `prev_psi` is the previous reading's PSI."""
    avail = inp.mem_available_bytes
    some, full, level = inp.psi_some_avg10, inp.psi_full_avg10, inp.memory_pressure
    reserve = cfg.reserve_bytes
    f = cfg.memory_release_factor
    easing = psi_easing(inp, prev_psi, reserve, short_recently)
    if easing:
        some = full = level = None  # on Linux the OS level is derived from the same PSI averages

    if full is not None and full >= cfg.psi_full_shed_pct:
        return MemoryMode.SHED, f"PSI full avg10 {full:.1f}% >= {cfg.psi_full_shed_pct:g}%"
    if avail is not None and avail < reserve:
        return MemoryMode.SHED, f"available {avail >> 20} MiB below the {reserve >> 20} MiB reserve"
    if level is not None and level >= PressureLevel.CRITICAL:
        return MemoryMode.SHED, f"OS memory pressure {level.name.lower()}"
    if prev is MemoryMode.SHED and (
        (full is not None and full >= cfg.psi_full_shed_pct * f)
        or (avail is not None and avail < reserve * 1.1)
    ):
        return MemoryMode.SHED, "memory still recovering after shedding"

    if some is not None and some >= cfg.psi_some_pause_pct:
        return MemoryMode.TIGHT, f"PSI some avg10 {some:.1f}% >= {cfg.psi_some_pause_pct:g}%"
    if avail is not None and avail < reserve * TIGHT_RESERVE_FACTOR:
        return MemoryMode.TIGHT, f"available {avail >> 20} MiB close to the {reserve >> 20} MiB reserve"
    if level is not None and level >= PressureLevel.HEAVY:
        return MemoryMode.TIGHT, f"OS memory pressure {level.name.lower()}"
    if prev in (MemoryMode.TIGHT, MemoryMode.SHED) and (
        (some is not None and some >= cfg.psi_some_pause_pct * f)
        or (avail is not None and avail < reserve * RELEASE_RESERVE_FACTOR)
    ):
        return MemoryMode.TIGHT, "memory pressure easing"
    if easing and (inp.psi_some_avg10 or 0.0) >= cfg.psi_some_pause_pct * f:
        return MemoryMode.OK, "memory ok: available again, PSI averages only trail the stalls"
    return MemoryMode.OK, "memory ok"


def should_evict(inp: ControlInput, mode: MemoryMode, prev_avail: tuple[float, int] | None,
                 evicted: bool, cfg: ControllerConfig) -> tuple[bool, str]:
    """Memory emergency: give the model's memory back (shed all work, unload), and why.

    llama.cpp commits the whole KV cache when it creates the context (it clears
    the buffer), so shedding requests frees no memory; only unloading does.
    Evict when, below the reserve, MemAvailable is under half of it, is falling
    fast enough to get there within `EVICT_HORIZON_S`, or PSI full is critical.
    Stay evicted until the memory mode is back to OK with room for the model
    (`footprint_bytes`) above the release level; the next request reloads.
    """
    if evicted:
        # a reload takes the memory back: wait for room for it above the release level, so that
        # reloading into a box that is still short does not evict again at once
        need = cfg.reserve_bytes * RELEASE_RESERVE_FACTOR + cfg.footprint_bytes
        room = inp.mem_available_bytes is None or inp.mem_available_bytes >= need
        return not (mode is MemoryMode.OK and room), (
            f"evicted: waiting for {need / (1 << 20):.0f} MiB available to reload")
    avail = inp.mem_available_bytes
    if mode is not MemoryMode.SHED or avail is None or avail >= cfg.reserve_bytes:
        return False, ""
    floor = cfg.reserve_bytes * EVICT_RESERVE_FACTOR
    if avail < floor:
        return True, f"available {avail >> 20} MiB under half the reserve: unloading the model"
    if prev_avail is not None and inp.t_s > prev_avail[0]:
        rate = (avail - prev_avail[1]) / (inp.t_s - prev_avail[0])
        if avail + rate * EVICT_HORIZON_S < floor:
            return True, (f"available {avail >> 20} MiB falling {-rate / (1 << 20):.0f} MiB/s: "
                          "unloading the model before the OOM killer acts")
    if inp.psi_full_avg10 is not None and inp.psi_full_avg10 >= PSI_FULL_EVICT_PCT:
        return True, f"PSI full avg10 {inp.psi_full_avg10:.1f}% below the reserve: unloading the model"
    return False, ""


@dataclass(frozen=True)
class MemoryVerdict:
    """The memory stage of `decide()`: mode, why, whether to evict, and when memory was last short."""

    mode: MemoryMode
    reason: str
    evict: bool
    short_at_s: float | None


def memory_verdict(inp: ControlInput, state: ControllerState, cfg: ControllerConfig) -> MemoryVerdict:
    now = inp.t_s
    short_at = now if memory_short(inp, cfg.reserve_bytes) else state.mem_short_at_s
    short_recently = short_at is not None and now - short_at <= PSI_TRAIL_S
    mode, reason = memory_mode(inp, state.memory, cfg, state.psi_prev, short_recently)
    evict, evict_reason = should_evict(inp, mode, state.mem_prev, state.evicted, cfg)
    if evict:
        if mode is MemoryMode.OK:
            mode = MemoryMode.TIGHT  # evicted: nothing is admitted until memory is fully back
        reason = f"{reason}; {evict_reason}"
    return MemoryVerdict(mode, reason, evict, short_at)


def free_kv_cells(stats: EngineStats, reserved_cells: int) -> int:
    """Cells a new request may claim.

    `reserved_cells` is the full need (prompt + max_tokens) of every admitted,
    unfinished request, which bounds what those requests can ever occupy;
    `kv_cells_used` also counts cells nobody reserved. Taking the larger of the
    two never counts a live request twice.
    """
    return stats.kv_cells_total - max(stats.kv_cells_used, reserved_cells)


def check_fits(
    prompt_tokens: int,
    max_tokens: int,
    stats: EngineStats | None,
    reserved_cells: int,
    mem_available_bytes: int | None,
    reserve_bytes: int,
    kv_bytes_per_cell: int = 0,
    retry_after_s: float = 2.0,
) -> None:
    """Raise unless the request's KV fits now and system memory stays above the reserve.

    `kv_bytes_per_cell` is the resident memory a cell adds when the KV buffer
    is committed lazily (0 when it is allocated up front, as llama.cpp does).
    """
    need = prompt_tokens + max_tokens
    if stats is not None and stats.kv_cells_total > 0:
        if need > stats.kv_cells_total:
            raise InsufficientMemory(
                need_bytes=need * max(1, kv_bytes_per_cell),
                available_bytes=stats.kv_cells_total * max(1, kv_bytes_per_cell),
                what=f"KV cache of this request ({need} cells, cache holds {stats.kv_cells_total})",
            )
        free = free_kv_cells(stats, reserved_cells)
        if need > free:
            raise KvCacheFull(need_cells=need, free_cells=max(0, free), retry_after_s=retry_after_s)
    if mem_available_bytes is not None and kv_bytes_per_cell > 0:
        need_bytes = need * kv_bytes_per_cell
        if mem_available_bytes - need_bytes < reserve_bytes:
            raise InsufficientMemory(
                need_bytes=need_bytes + reserve_bytes,
                available_bytes=mem_available_bytes,
                what="this request's KV cache plus the memory reserve",
            )
