"""`edge serve`'s preload: the deployment record and other afterthoughts run after the load, and
never hold up the scheduler that waits for the load."""

from __future__ import annotations

import threading

from edge.commands.serve import Preload


class _Engine:
    def __init__(self, fail: bool = False) -> None:
        self.go = threading.Event()
        self.fail = fail

    def start(self) -> None:
        assert self.go.wait(10)
        if self.fail:
            raise RuntimeError("bad file")


def test_afterthoughts_run_after_the_load_and_wait_does_not_wait_for_them() -> None:
    engine, order = _Engine(), []
    hold = threading.Event()
    p = Preload(engine)  # type: ignore[arg-type]
    p.then(lambda: (order.append("record"), hold.wait(10)))
    p.then(lambda: order.append("second"))
    assert not p._loaded.is_set() and order == []  # not loaded yet: nothing ran
    engine.go.set()
    assert p.wait(10) is None  # the load's outcome, while the record is still being written
    assert order == ["record"]
    hold.set()
    p._thread.join(10)
    assert order == ["record", "second"]
    ran_on: list[str] = []
    p.then(lambda: (order.append("late"), ran_on.append(threading.current_thread().name)))
    p._thread.join(10)  # after everything ended: on a thread again, never the caller's
    assert order[-1] == "late" and ran_on == ["edge-preload"]


def test_afterthoughts_run_when_the_load_fails_and_their_errors_are_not_the_loads() -> None:
    engine, order = _Engine(fail=True), []
    p = Preload(engine)  # type: ignore[arg-type]
    p.then(lambda: 1 / 0)
    p.then(lambda: order.append("record"))
    engine.go.set()
    p._thread.join(10)
    assert isinstance(p.wait(0), RuntimeError) and order == ["record"]


def test_delayed_work_waits_after_the_load_and_hurry_runs_it_at_once() -> None:
    engine, order, asked = _Engine(), [], []
    waiting = threading.Event()

    def pause(hurry: threading.Event, seconds: float) -> None:  # no real time: until hurry()
        asked.append(seconds)
        waiting.set()
        assert hurry.wait(10)

    p = Preload(engine, pause)  # type: ignore[arg-type]
    p.then(lambda: order.append("record"), after_s=60.0)
    engine.go.set()
    assert p.wait(10) is None
    assert waiting.wait(10) and asked == [60.0] and order == []  # loaded; the record waits its turn
    p.hurry()  # the server ends first: written now, not lost
    assert order == ["record"] and not p._thread.is_alive()
