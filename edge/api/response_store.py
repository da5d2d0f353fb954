"""Responses kept for `previous_response_id` and `GET /v1/responses/{id}`: in memory, bounded.

An LRU bounded by entry count and by size (the JSON text of what is kept), with a time to live;
an entry past its TTL is gone at the next look-up. Each entry holds the whole conversation up to
and including that response, so a chain still resolves after its older links were evicted. The
store lives and dies with the process (a restart forgets every response), as documented.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class StoredResponse:
    response: dict[str, Any]  # the response object as the API returned it
    conversation: tuple[dict[str, Any], ...]  # input items through this response's output
    size_bytes: int
    stored_s: float


class ResponseStore:
    """Thread-safe; `max_entries=0` keeps nothing (every previous_response_id is then unknown)."""

    def __init__(self, max_entries: int = 256, max_bytes: int = 64 << 20, ttl_s: float = 3600.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self.clock = clock
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def put(self, response_id: str, response: dict[str, Any], conversation: list[dict[str, Any]]) -> bool:
        """Keep a response; False when it alone exceeds the size bound (then it is not kept)."""
        size = len(json.dumps(response)) + len(json.dumps(conversation))
        if self.max_entries <= 0 or size > self.max_bytes:
            return False
        entry = StoredResponse(response, tuple(conversation), size, self.clock())
        with self._lock:
            self._drop(response_id)
            self._entries[response_id] = entry
            self._bytes += size
            while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
                self._drop(next(iter(self._entries)))
        return True

    def get(self, response_id: str) -> StoredResponse | None:
        with self._lock:
            entry = self._entries.get(response_id)
            if entry is None:
                return None
            if self.clock() - entry.stored_s > self.ttl_s:
                self._drop(response_id)
                return None
            self._entries.move_to_end(response_id)
            return entry

    def delete(self, response_id: str) -> bool:
        with self._lock:
            return self._drop(response_id)

    def _drop(self, response_id: str) -> bool:
        entry = self._entries.pop(response_id, None)
        if entry is None:
            return False
        self._bytes -= entry.size_bytes
        return True
