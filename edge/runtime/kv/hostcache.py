"""Prompt caches kept in host memory: an idle slot's KV cells, moved out of the KV cache.

In llama.cpp's unified KV cache every step's attention spans every used cell, other
sequences' included (they are masked, not skipped): on a 2-core Sapphire Rapids VM (Qwen2.5
Coder 0.5B, no flash attention) three idle prompt caches of 450 cells made a one-token step
10 % slower and a new prompt's evaluation 28 % slower. Dropping them would lose the cache hits
a returning document or conversation gets. So when a request takes a slot, the other idle
slots' cells are saved here (`llama_state_seq_get_data`, ~12 KiB per cell for that model,
copied in milliseconds) and removed from the KV cache; a later prompt that starts like one of
them has it restored into its slot (`llama_state_seq_set_data`) instead of evaluated again.
The engine thread owns it; the step plan sees only `StashView`s. Least recently used entries
go first when the byte budget is reached; an entry that another one extends is dropped.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from edge.runtime.step.slots import StashView, common_prefix_len


@dataclass
class Entry:
    key: int
    tokens: tuple[int, ...]
    data: bytes | memoryview  # LlamaContext.seq_state: a view of its own anonymous mapping
    last_used: int

    def view(self) -> StashView:
        return StashView(self.key, self.tokens)


class HostCache:
    """Entries of (tokens, sequence state) within `budget_bytes`; engine thread only."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = max(0, budget_bytes)
        self.entries: dict[int, Entry] = {}
        self.used_bytes = 0
        self.stashed = self.restored = 0  # counters, for stats
        self._next_key = 0
        self._tick = 0

    @property
    def on(self) -> bool:
        return self.budget_bytes > 0

    def views(self) -> tuple[StashView, ...]:
        return tuple(e.view() for e in self.entries.values())

    def put(self, tokens: Sequence[int], data: bytes | memoryview, keep: Collection[int] = ()) -> bool:
        """Keep a slot's cache (True when it is held afterwards); an entry it extends goes, and
        it is not kept twice if one extends it. Entries in `keep` (those a step about to run
        restores) stay whatever this costs."""
        toks = tuple(tokens)
        if not toks or not data or len(data) > self.budget_bytes:
            return False
        for e in list(self.entries.values()):
            shared = common_prefix_len(e.tokens, toks)
            if shared == len(toks):  # already held, whole or as the start of a longer one
                e.last_used = self._bump()
                return True
            if shared == len(e.tokens) and e.key not in keep:
                self._drop(e)
        kept_bytes = sum(len(e.data) for e in self.entries.values() if e.key in keep)
        if kept_bytes + len(data) > self.budget_bytes:
            return False  # no room without losing what is about to be restored: not kept
        while self.used_bytes + len(data) > self.budget_bytes:
            evictable = (e for e in self.entries.values() if e.key not in keep)
            self._drop(min(evictable, key=lambda e: e.last_used))
        self._next_key += 1
        self.entries[self._next_key] = Entry(self._next_key, toks, data, self._bump())
        self.used_bytes += len(data)
        self.stashed += 1
        return True

    def take(self, key: int) -> Entry | None:
        """The entry to restore (it stays: the slot may diverge from it and drop the rest);
        None if it is gone."""
        e = self.entries.get(key)
        if e is None:
            return None
        e.last_used = self._bump()
        self.restored += 1
        return e

    def clear(self) -> None:
        self.entries.clear()
        self.used_bytes = 0

    def shrink(self, keep_bytes: int) -> None:
        """Least recently used entries out until at most `keep_bytes` stay (an unload keeps a few)."""
        while self.entries and self.used_bytes > max(0, keep_bytes):
            self._drop(min(self.entries.values(), key=lambda e: e.last_used))

    def _drop(self, e: Entry) -> None:
        del self.entries[e.key]
        self.used_bytes -= len(e.data)

    def _bump(self) -> int:
        self._tick += 1
        return self._tick
