"""Admission when no scheduler is wired in: a bounded count of requests in flight.

The engine keeps its own priority-ordered wait queue (interactive first); this
only bounds it. At most `n_slots` requests run and `max_queue` wait; one more is
refused with QueueFull (HTTP 503 + Retry-After), so the queue really bounds.
The scheduler's `Admission` replaces this with thermal and memory checks.
"""

from __future__ import annotations

import threading
from typing import Any, Protocol

from edge.errors import QueueFull
from edge.runtime.types import Priority


class TicketLike(Protocol):
    def release(self) -> None: ...


class AdmissionLike(Protocol):
    def admit(self, priority: Priority, prompt_tokens: int, max_tokens: int) -> TicketLike: ...


class _Ticket:
    def __init__(self, owner: BoundedAdmission) -> None:
        self._owner = owner
        self._released = False

    def release(self) -> None:
        """Idempotent: a request path may release on several exits."""
        if not self._released:
            self._released = True
            self._owner._release()


class BoundedAdmission:
    def __init__(self, n_running: int, max_queue: int, retry_after_s: float = 1.0) -> None:
        self.n_running = n_running
        self.max_queue = max_queue
        self.retry_after_s = retry_after_s
        self._in_flight = 0
        self._lock = threading.Lock()

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def admit(self, priority: Priority, prompt_tokens: int, max_tokens: int) -> _Ticket:
        with self._lock:
            if self._in_flight >= self.n_running + self.max_queue:
                raise QueueFull(self.max_queue, self.retry_after_s)
            self._in_flight += 1
        return _Ticket(self)

    def _release(self) -> None:
        with self._lock:
            self._in_flight -= 1

    def status(self) -> dict[str, Any]:
        return {
            "kind": "bounded",
            "in_flight": self._in_flight,
            "max_running": self.n_running,
            "max_queue": self.max_queue,
        }
