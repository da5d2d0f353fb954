"""The actuator ladder: knob settings ordered from full speed down to paused.

The thermal budget is a load fraction; the ladder turns it into knobs: stop
admitting background work, then fewer threads and a decode duty cycle, then
fewer active sequences, then pause (KV kept). Sequences come after threads and
duty because the measured figures (configs/throughput) show a batch of 8
decodes ~1.7x the tokens of a batch of 1 at nearly the same power: parking
sequences saves little heat per token lost. The one case where fewer sequences
comes first is interactive work sharing the device with background work: see
`interactive_first()`. Each level carries the controller's *estimate* of its
load; the learned sustainable load and the integral absorb that estimate's
error on a given device. Given measured decode figures (a calibration), the
threads x duty part keeps only settings on the efficiency frontier (`_efficient`),
the load estimate charges a bigger batch only for the arithmetic it measurably
adds (`batch_share`), and each level names the batch at which background work
runs best there (`Level.batch`).
"""

from __future__ import annotations

from dataclasses import dataclass

from edge.contracts.engine import Knobs

DUTY_GRID = tuple(round(1.0 - 0.05 * i, 2) for i in range(19))  # 1.0, 0.95, ... 0.1


Rates = dict[tuple[int, int], float]  # (threads, sequences) -> measured aggregate decode tokens/s


def rate(rates: Rates, threads: int, sequences: int) -> float:
    """Measured aggregate decode tokens/s, from the nearest figure at or below (threads, sequences)."""
    known = [k for k in rates if k[0] <= threads and k[1] <= sequences]
    return rates[max(known)] if known else 0.0


def batch_share(active: int, threads: int, n_slots: int, rates: Rates | None = None) -> float:
    """Power of busy cores decoding `active` sequences, as a share of their power at the fastest batch.

    A lone sequence is bound by fetching weights and leaves the arithmetic units
    partly idle; each sequence added to the batch does more arithmetic per weight
    fetched. Without figures that extra is taken as linear in the batch (0.6 ->
    1.0). With measured figures it follows the measured batch speedup (0.7 -> 1.0):
    where adding sequences does not raise tokens/s (one compute-bound thread) it
    does not add arithmetic or heat either, and where it does, heat rises with it.
    """
    active = min(max(1, active), n_slots)
    if rates:
        one, best = rate(rates, threads, 1), rate(rates, threads, n_slots)
        if one > 0 and best > one * 1.001:
            return 0.7 + 0.3 * max(0.0, rate(rates, threads, active) - one) / (best - one)
        if one > 0:
            return 1.0
    return 0.6 + 0.4 * active / n_slots


def estimated_load(active: int, threads: int, duty: float, n_slots: int, max_threads: int,
                   off_threads: int = 0, rates: Rates | None = None) -> float:
    """Rough share of full power: busy cores x time stepping x the batch's share (`batch_share`).

    With `off_threads`, the rest of the duty cycle steps with that many threads instead of idling.
    """
    if active <= 0 or duty <= 0:
        return 0.0
    threads, off = min(threads, max_threads), min(max(0, off_threads), max_threads)
    on = duty * threads * batch_share(active, threads, n_slots, rates)
    rest = (1.0 - duty) * off * batch_share(active, off, n_slots, rates) if off else 0.0
    return (on + rest) / max_threads


@dataclass(frozen=True)
class Level:
    knobs: Knobs
    load: float  # estimated load of this level, 0..1
    label: str
    batch: int = 0  # sequences that deliver the most tokens per load here (0: every slot)


DecodeTable = tuple[tuple[int, int, float], ...]  # (threads, sequences, aggregate decode tokens/s)


def build_ladder(n_slots: int, max_threads: int, min_duty: float = 0.2,
                 decode_tps: DecodeTable = ()) -> tuple[Level, ...]:
    """Levels from full speed (index 0) to paused (last index); loads never increase."""
    n_slots, max_threads = max(1, n_slots), max(1, max_threads)
    table = rates_of(decode_tps)

    def lvl(active: int, threads: int, duty: float, bg: bool, label: str, off: int = 0) -> Level:
        load = estimated_load(active, threads, duty, n_slots, max_threads, off, table)
        knobs = Knobs(active, threads, duty, paused=False, admit_background=bg, off_threads=off)
        batch = best_batch(active, threads, duty, off, n_slots, max_threads, table)
        return Level(knobs, load, label + (f", {off} off-duty" if off else ""), batch)

    levels = [
        lvl(n_slots, max_threads, 1.0, True, "full"),
        lvl(n_slots, max_threads, 1.0, False, "no new background"),
    ]
    # (threads, duty, off-duty threads); stepping with fewer threads instead of idling is only
    # offered where measured figures can tell whether it buys tokens
    combos = [(t, d, o) for t in range(1, max_threads + 1) for d in DUTY_GRID
              for o in (range(t) if table and d < 1.0 else (0,)) if o or d >= min_duty - 1e-9]
    # by estimated load, fewer threads first on ties
    combos.sort(key=lambda c: (-estimated_load(n_slots, c[0], c[1], n_slots, max_threads, c[2], table), c[0]))
    if table:
        combos = _efficient(combos, n_slots, table)
    for threads, duty, off in combos:
        cand = lvl(n_slots, threads, duty, False, f"{threads} threads, duty {duty:g}", off)
        if cand.load < levels[-1].load - 0.015:
            levels.append(cand)
    floor = levels[-1].knobs
    for active in range(n_slots - 1, 0, -1):
        cand = lvl(active, floor.n_threads, floor.duty, False,
                   f"{active} active, {floor.n_threads} threads, duty {floor.duty:g}", floor.off_threads)
        if cand.load < levels[-1].load - 0.005:
            levels.append(cand)
    paused = Knobs(1, floor.n_threads, floor.duty, paused=True, admit_background=False)
    levels.append(Level(paused, 0.0, "paused"))
    return tuple(levels)


def rates_of(decode_tps: DecodeTable) -> Rates:
    return {(t, s): v for t, s, v in decode_tps if v > 0}


def expected_tps(rates: Rates, threads: int, duty: float, off: int, sequences: int) -> float:
    """Tokens/s of a duty cycle: `duty` of the time at `threads`, the rest at `off` threads (0: idle)."""
    rest = rate(rates, off, sequences) if off else 0.0
    return duty * rate(rates, threads, sequences) + (1.0 - duty) * rest


def best_batch(active: int, threads: int, duty: float, off: int, n_slots: int, max_threads: int,
               rates: Rates) -> int:
    """Batch size (at most `active`) with the most expected tokens per estimated load; 0 without figures.

    Only background work is held to it (interactive requests are never parked to
    save heat: queueing chat users tripled p99 time to first token in `edge sim`).
    Where one thread is compute-bound and batches of 1-3 decode equally fast,
    a fourth background sequence adds heat and few tokens; near-ties (1 %) go to
    the bigger batch, which serves more requests at once.
    """
    if not rates:
        return 0
    best_n, best = active, -1.0
    for n in range(active, 0, -1):
        load = estimated_load(n, threads, duty, n_slots, max_threads, off, rates)
        value = expected_tps(rates, threads, duty, off, n) / load if load > 0 else 0.0
        if value > best * 1.01:
            best_n, best = n, value
    return best_n


def _efficient(combos: list[tuple[int, float, int]], n_slots: int,
               table: dict[tuple[int, int], float]) -> list[tuple[int, float, int]]:
    """Keep the (threads, duty, off-duty threads) settings on the efficiency frontier, in load order.

    Expected tokens/s of a setting = duty x the measured aggregate decode rate
    with every slot busy, plus (1 - duty) x the rate at the off-duty threads. A
    setting is dropped when a cheaper one is expected to deliver as many tokens
    (1 % tolerance): where decode is memory-bound and one thread is nearly as
    fast as two, one thread at full duty beats two duty-cycled at the same heat,
    and two threads part of the time with one thread (not idling) the rest beat
    both in between. Only threads and duty are traded here: fewer
    active sequences would save heat too, but requests beyond the active limit
    wait for a slot (in `edge sim` chat, p99 time to first token rose from 5 s
    to 16.5 s when the frontier included them), so they stay last on the ladder.
    """
    kept: list[tuple[int, float, int]] = []
    best = 0.0
    for threads, duty, off in reversed(combos):  # cheapest first
        value = expected_tps(table, threads, duty, off, n_slots)
        if value > best * 1.01:
            kept.append((threads, duty, off))
            best = value
    return kept[::-1]


def interactive_first(level: Level, n_interactive: int, n_slots: int, max_threads: int,
                      min_duty: float, headroom: bool, rates: Rates | None = None) -> Knobs:
    """Knobs that serve interactive sequences at full speed and fill the rest of the budget with background.

    The engine fills its active set interactive-first, so the active limit decides
    how many background sequences keep decoding beside the interactive ones; the
    others are parked (KV kept). With `headroom` (forecast at most a little over
    target, well under the guard) the interactive sequences get full speed even
    if that alone exceeds the level's load: a few seconds of them barely warm the
    heatsink, and the forecast takes the boost away if they do. Without headroom
    and when even they exceed the budget, they get a duty cycle that fits it.
    """
    n = max(1, min(n_interactive, n_slots))
    budget = level.load
    if headroom:
        budget = max(budget, estimated_load(n, max_threads, 1.0, n_slots, max_threads, rates=rates))
    def full_speed(active: int) -> float:
        return estimated_load(active, max_threads, 1.0, n_slots, max_threads, rates=rates)

    active = n
    while active < n_slots and full_speed(active + 1) <= budget + 1e-9:
        active += 1
    if full_speed(active) <= budget + 1e-9:
        return Knobs(active, max_threads, 1.0, paused=False, admit_background=False)
    for threads in range(max_threads, 0, -1):
        per_duty = estimated_load(n, threads, 1.0, n_slots, max_threads, rates=rates)
        duty = min(1.0, budget / per_duty)
        if duty >= min_duty:
            return Knobs(n, threads, round(duty, 3), paused=False, admit_background=False)
    return Knobs(n, 1, min_duty, paused=False, admit_background=False)


def level_for_budget(ladder: tuple[Level, ...], budget: float) -> int:
    """Index of the fastest level whose estimated load fits in `budget`."""
    for i, level in enumerate(ladder):
        if level.load <= budget + 1e-9:
            return i
    return len(ladder) - 1


def level_at_most(ladder: tuple[Level, ...], load: float) -> int:
    """Fastest running (not paused) level with load <= `load`, else the slowest running one."""
    idx = level_for_budget(ladder, load)
    return min(idx, len(ladder) - 2)
