"""Idle prompt caches in host memory: what is kept within the budget, what an entry replaces."""

from __future__ import annotations

from edge.runtime.kv.hostcache import HostCache


def test_entries_within_the_budget_least_recently_used_go_first() -> None:
    h = HostCache(budget_bytes=100)
    h.put([1, 2, 3], b"a" * 40)
    h.put([4, 5, 6], b"b" * 40)
    assert h.used_bytes == 80 and len(h.entries) == 2
    first = next(iter(h.entries))
    h.take(first)  # restored: now the most recently used
    h.put([7, 8, 9], b"c" * 40)  # 120 > 100: the least recently used ([4, 5, 6]) goes
    assert sorted(e.tokens for e in h.entries.values()) == [(1, 2, 3), (7, 8, 9)]
    assert h.used_bytes == 80 and h.stashed == 3 and h.restored == 1
    h.put([1], b"x" * 101)  # larger than the whole budget: not kept, nothing evicted for it
    assert len(h.entries) == 2


def test_an_entry_that_extends_another_replaces_it_and_a_prefix_of_one_is_not_kept() -> None:
    h = HostCache(budget_bytes=1000)
    h.put([1, 2, 3], b"turn one")
    h.put([1, 2, 3, 4, 5], b"turn one and two")  # the same conversation, one turn on
    assert [e.tokens for e in h.entries.values()] == [(1, 2, 3, 4, 5)]
    h.put([1, 2, 3], b"turn one again")  # already held as the start of a longer one
    assert [e.tokens for e in h.entries.values()] == [(1, 2, 3, 4, 5)] and h.used_bytes == 16
    h.put([1, 2, 9], b"another branch")  # a different continuation is a different cache
    assert len(h.entries) == 2
    views = {v.key: tuple(v.tokens) for v in h.views()}
    assert sorted(views.values()) == [(1, 2, 3, 4, 5), (1, 2, 9)]
    h.clear()
    assert not h.entries and h.used_bytes == 0


def test_a_zero_budget_is_off() -> None:
    h = HostCache(0)
    h.put([1, 2], b"x")
    assert not h.on and not h.entries


def test_entries_a_step_restores_are_neither_replaced_nor_evicted() -> None:
    h = HostCache(budget_bytes=100)
    h.put([1, 2, 3], b"a" * 40)
    h.put([4, 5, 6], b"b" * 40)
    keys = {e.tokens: e.key for e in h.entries.values()}
    h.put([1, 2, 3, 4], b"c" * 10, keep={keys[(1, 2, 3)]})  # extends it, but it is about to be restored
    assert (1, 2, 3) in {e.tokens for e in h.entries.values()} and len(h.entries) == 3
    h.put([7], b"d" * 60, keep=set(keys.values()))  # room only by evicting kept ones: not kept itself
    assert {e.tokens for e in h.entries.values()} == {(1, 2, 3), (4, 5, 6), (1, 2, 3, 4)}
    assert h.take(keys[(1, 2, 3)]) is not None and h.take(12345) is None


def test_an_unload_keeps_only_the_most_recent_entries_within_its_share() -> None:
    h = HostCache(budget_bytes=1000)
    for i in range(4):
        h.put([i], bytes(100))
    h.take(next(iter(h.entries)))  # the oldest was just restored: the most recent now
    h.shrink(250)
    assert sorted(e.tokens for e in h.entries.values()) == [(0,), (3,)] and h.used_bytes == 200
    h.shrink(0)
    assert not h.entries and h.used_bytes == 0
