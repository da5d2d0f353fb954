"""Graceful drain: stop admitting, let running generations finish, then cancel the rest.

Called on the first SIGTERM. Time and sleeping are injected so tests drive it
with a fake clock; production uses the event loop's real sleep.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from edge.api.state import ApiState, ServerState

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DrainResult:
    finished: int  # requests that completed on their own during the drain
    cancelled: int  # requests cancelled when the timeout ran out
    left: int  # requests still registered after the grace period (should be 0)
    waited_s: float


async def drain(
    state: ApiState,
    timeout_s: float,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    poll_s: float = 0.05,
    cancel_grace_s: float = 5.0,
) -> DrainResult:
    """Drain `state`'s in-flight requests within `timeout_s`; always returns (nothing hangs)."""
    start_s = clock()
    state.begin_drain()
    at_start = len(state.in_flight)
    log.info("draining: %d request(s) in flight, up to %.1f s", at_start, timeout_s)
    deadline_s = start_s + timeout_s
    while state.in_flight and clock() < deadline_s:
        await sleep(poll_s)
    cancelled = 0
    if state.in_flight:
        cancelled = state.cancel_all()
        log.warning("drain timeout: cancelled %d request(s)", cancelled)
        grace_end_s = clock() + cancel_grace_s
        while state.in_flight and clock() < grace_end_s:
            await sleep(poll_s)
    state.server_state = ServerState.STOPPED
    return DrainResult(at_start - cancelled, cancelled, len(state.in_flight), clock() - start_s)
