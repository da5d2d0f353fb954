"""The KV side of an admission, as the plan's `Admit` says: evict, stash, share, restore, trim.

Execution only: which slot, how many cached tokens it keeps, which idle caches move to host
memory and which are dropped were decided by the plan (plan.py, slots.py). What the context
could not do as planned (a partial removal llama.cpp refused, a restore that failed, a cache
host memory did not keep) is reported back, for the step's `StepOutcome`.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from edge.runtime.kv.hostcache import HostCache
from edge.runtime.step.slots import SlotState

if TYPE_CHECKING:
    from edge.runtime.kv.residency import Live
    from edge.runtime.step.plan import Admit
    from edge.runtime.step.slots import Slot

log = logging.getLogger("edge.engine")


@dataclass(frozen=True)
class Taken:
    """One admission's KV as carried out: cached tokens kept, stashes host memory refused."""

    n_keep: int
    stash_refused: int = 0


class SlotKV:
    """Carries out admissions' KV operations over the loop's slots and the host cache."""

    def __init__(self, slots: Sequence[Slot], host: HostCache) -> None:
        self.slots = slots
        self.host = host

    def take_slot(self, live: Live, a: Admit, restoring: Collection[int]) -> Taken:
        """Evictions, stashes and the cache the slot starts from; `restoring`: host entries
        this step restores, kept while others stash."""
        for sid in a.evict:
            self.drop(live, self.slots[sid])
        slot = self.slots[a.seq_id]
        refused = 0
        if a.seq_id in a.stash:
            refused += self._stash(live, slot, drop=False, keep=restoring)  # not kept whole
        others = [self.slots[sid] for sid in a.stash if sid != a.seq_id]
        # a shared prefix's cells lie where the source put them: the source stays until the copy.
        # Otherwise the others leave first: a restore's cells (and a prompt's) are placed at
        # llama.cpp's head, and behind caches about to go they would hold the pool's top cell up
        first = a.source < 0
        if first:
            refused += sum(self._stash(live, other, keep=restoring) for other in others)
        if a.source >= 0:
            n_keep = self._share_prefix(live, slot, self.slots[a.source], a.n_keep)
        elif a.restore >= 0:
            n_keep = self._restore(live, slot, a.restore, a.n_keep)
        else:
            n_keep = self.trim(live, slot, a.n_keep)
        if not first:
            refused += sum(self._stash(live, other, keep=restoring) for other in others)
        return Taken(n_keep, refused)

    def trim(self, live: Live, slot: Slot, n_keep: int) -> int:
        """Remove the slot's KV beyond `n_keep` (the plan already kept a sliding-window cache
        only where it still holds what the tail needs); all of it when llama.cpp cannot remove
        part of a sequence (a recurrent model's state)."""
        ctx = live.ctx
        if 0 < n_keep < len(slot.tokens) and not ctx.seq_rm(slot.seq_id, n_keep, -1):
            n_keep = 0
        if n_keep == 0:
            ctx.seq_rm(slot.seq_id, -1, -1)
        del slot.tokens[n_keep:]
        return n_keep

    def _share_prefix(self, live: Live, slot: Slot, source: Slot, n_keep: int) -> int:
        """The slot drops its own cache and owns `source`'s first n_keep cells as well."""
        self.drop(live, slot)
        n_keep = min(n_keep, len(source.tokens))
        if n_keep > 0:
            live.ctx.seq_cp(source.seq_id, slot.seq_id, 0, n_keep)
            slot.tokens.extend(source.tokens[:n_keep])
        return n_keep

    def _stash(self, live: Live, slot: Slot, drop: bool = True, keep: Collection[int] = ()) -> int:
        """Move (or with `drop` False, copy) an idle slot's cache to host memory, as planned:
        its cells leave the KV cache either way. Returns 1 when host memory did not keep it."""
        if not slot.tokens:
            return 0
        kept = self.host.put(slot.tokens, live.ctx.seq_state(slot.seq_id), keep)
        if drop:
            self.drop(live, slot)
        return 0 if kept else 1

    def _restore(self, live: Live, slot: Slot, key: int, n_keep: int) -> int:
        """A stashed cache back as this slot's, cut to its first n_keep cells (0 if it failed)."""
        entry = self.host.take(key)
        self.drop(live, slot)
        if entry is None:  # pushed out since the plan (kept only within one admission step)
            return 0
        if not live.ctx.set_seq_state(slot.seq_id, entry.data):
            log.warning("could not restore a %d-token prompt cache; evaluating the prompt", len(entry.tokens))
            live.ctx.seq_rm(slot.seq_id, -1, -1)
            return 0
        slot.tokens.extend(entry.tokens)
        return self.trim(live, slot, min(n_keep, len(entry.tokens)))

    def stash_idle(self, live: Live) -> None:
        """Copy the idle slots' caches to host memory, the most recently used last (pushed out
        last): before an unload, so a conversation that goes on after it is not evaluated again."""
        for slot in sorted(self.slots, key=lambda s: s.last_used):
            if slot.state is SlotState.IDLE:
                self._stash(live, slot, drop=False)

    def drop(self, live: Live, slot: Slot) -> None:
        live.ctx.seq_rm(slot.seq_id, -1, -1)
        slot.tokens.clear()
