"""The step loop's published `EngineStats`: one snapshot per step, replaced whole."""

from __future__ import annotations

from typing import TYPE_CHECKING

from edge.runtime.step.slots import kv_cells_held
from edge.runtime.types import EngineStats, Priority

if TYPE_CHECKING:
    from edge.runtime.embed.queue import EmbedQueue
    from edge.runtime.step.loop import StepLoop


def embed_counts(e: EmbedQueue) -> dict[str, int]:
    return {"embed_batches": e.batches, "embed_inputs": e.inputs, "chat_steps_with_embed": e.beside_chat}


def snapshot(loop: StepLoop, step_s: float, decode_s: float, n_dec: int, n_pre: int) -> EngineStats:
    """What the engine thread publishes after a step (or a pause): queue, KV, knobs, counters."""
    knobs, totals = loop.knobs, loop._totals
    n_active = 0 if knobs.paused else min(len(loop.running), knobs.active_limit)
    n_ctx = loop.res.live.n_ctx if loop.res.loaded else 0
    spec, host = loop.spec, loop.host
    return EngineStats(
        state=loop.mailbox.state,
        step_time_s=step_s,
        decode_time_s=decode_s,
        tokens_decoded=n_dec,
        tokens_prefilled=n_pre,
        active=n_active,
        parked=len(loop.running) - n_active,
        waiting=len(loop.waiting),
        waiting_interactive=sum(1 for e in loop.waiting if e[0][0] == Priority.INTERACTIVE),
        kv_cells_used=kv_cells_held(loop.slots),
        kv_cells_total=n_ctx,
        n_slots=loop.n_slots,
        knobs=knobs,
        total_tokens_decoded=totals[0],
        total_tokens_prefilled=totals[1],
        total_steps=totals[2],
        last_progress_s=loop.clock.monotonic(),
        interactive_awaiting_first=sum(1 for q in loop.running.values()
                                       if q.request.priority is Priority.INTERACTIVE and q.n_gen == 0),
        **embed_counts(loop.embeds),
        speculative=spec.mode,
        spec_drafted=spec.drafted,
        spec_accepted=spec.accepted,
        spec_draft_len=spec.last_draft_len,
        flash_attn=loop.res.flash_attn,
        attention=loop.res.attention,
        prompt_cache_entries=len(host.entries),
        prompt_cache_bytes=host.used_bytes,
        prompt_cache_restored=host.restored,
    )
