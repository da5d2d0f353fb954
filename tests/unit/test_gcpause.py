"""The collector paused for a server's start (edge/gcpause.py)."""

from __future__ import annotations

import gc

from edge.gcpause import GcPause


def test_a_paused_start_collects_freezes_and_turns_the_collector_back_on() -> None:
    was = gc.get_freeze_count()
    pause = GcPause()
    try:
        pause.pause()
        assert not gc.isenabled()
        a: list[object] = []
        a.append(a)  # a cycle the start left behind
        del a
        assert pause.settle() >= 1
        assert gc.isenabled() and gc.get_freeze_count() > was
        assert pause.settle() == 0  # once
    finally:
        gc.unfreeze()
        gc.enable()


def test_settle_leaves_a_collector_it_did_not_pause_alone() -> None:
    gc.disable()  # someone else's choice (a host process, a profiler)
    try:
        pause = GcPause()
        pause.pause()
        assert pause.settle() == 0 and not gc.isenabled()
    finally:
        gc.enable()
