"""One scheduler over several engines: the box's knobs shared, the engines' stats summed. Pure.

The controller decides for the box (threads, duty cycle, pause, speculation), not per
model: its heat and power stay where one model would keep them. So the models that are
busy at once split the threads the decision allows (two busy models on two threads get
one each) and all keep the same duty cycle; an idle model holds its share until it is
busy, when the host splits again. The scheduler reads one `EngineStats`: the busy
engines' queues, slots, KV cells and rates added up.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from edge.contracts.engine import EngineState, EngineStats, Knobs


def share_knobs(knobs: Knobs, n_busy: int) -> Knobs:
    """What each of `n_busy` engines running at once gets of the box's `knobs`."""
    if n_busy <= 1:
        return knobs
    threads = max(1, knobs.n_threads // n_busy)
    off = min(knobs.off_threads // n_busy, threads - 1)
    return replace(knobs, n_threads=threads, off_threads=max(0, off))


def host_state(states: Sequence[EngineState], loading: bool) -> EngineState:
    """The host as one engine: READY when any model is (or none needs to be: models load on
    demand, so an empty host is UNLOADED, which /ready counts as ready), LOADING while the
    first model loads."""
    if any(s in (EngineState.READY, EngineState.PAUSED) for s in states):
        paused = all(s is EngineState.PAUSED for s in states if s in (EngineState.READY, EngineState.PAUSED))
        return EngineState.PAUSED if paused else EngineState.READY
    return EngineState.LOADING if loading else EngineState.UNLOADED


def combined_stats(stats: Sequence[EngineStats], knobs: Knobs, n_slots: int, n_ctx: int,
                   state: EngineState, loading_bytes: int = 0) -> EngineStats:
    """The engines' snapshots as one: counts and cumulative counters added, the last step's
    time the longest (they step at once), the box's knobs."""
    if not stats:
        return EngineStats(state, 0.0, 0.0, 0, 0, 0, 0, 0, 0, 0, n_ctx, n_slots, knobs,
                           loading_bytes=loading_bytes)

    def total(name: str) -> int:
        return sum(int(getattr(s, name)) for s in stats)

    return EngineStats(
        state=state,
        step_time_s=max(s.step_time_s for s in stats),
        decode_time_s=max(s.decode_time_s for s in stats),
        tokens_decoded=total("tokens_decoded"),
        tokens_prefilled=total("tokens_prefilled"),
        active=total("active"),
        parked=total("parked"),
        waiting=total("waiting"),
        waiting_interactive=total("waiting_interactive"),
        kv_cells_used=total("kv_cells_used"),
        kv_cells_total=total("kv_cells_total"),
        n_slots=total("n_slots"),
        knobs=knobs,
        total_tokens_decoded=total("total_tokens_decoded"),
        total_tokens_prefilled=total("total_tokens_prefilled"),
        total_steps=total("total_steps"),
        last_progress_s=max(s.last_progress_s for s in stats),
        interactive_awaiting_first=total("interactive_awaiting_first"),
        embed_batches=total("embed_batches"),
        embed_inputs=total("embed_inputs"),
        chat_steps_with_embed=total("chat_steps_with_embed"),
        speculative=stats[0].speculative,
        spec_drafted=total("spec_drafted"),
        spec_accepted=total("spec_accepted"),
        spec_draft_len=max(s.spec_draft_len for s in stats),
        flash_attn=stats[0].flash_attn,
        prompt_cache_entries=total("prompt_cache_entries"),
        prompt_cache_bytes=total("prompt_cache_bytes"),
        prompt_cache_restored=total("prompt_cache_restored"),
        attention=stats[0].attention,
        loading_bytes=loading_bytes,
    )
