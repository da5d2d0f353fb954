"""systemd notify protocol (sd_notify) and an engine-liveness watchdog.

The protocol is one datagram of `KEY=VALUE` lines sent to the unix socket named
by `$NOTIFY_SOCKET`; a name starting with `@` is a Linux abstract socket. With no
socket (not under systemd) every call is a no-op, so the server needs no special
mode. The watchdog pings `WATCHDOG=1` only while the engine is healthy: making
progress, or idle, or deliberately paused. A hung engine thread stops the pings
and systemd restarts the service (Restart=on-failure).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Mapping

from edge.runtime.types import EngineLike, EngineState, EngineStats

log = logging.getLogger(__name__)

# LOADING counts as healthy: a big model may load for longer than WatchdogSec.
HEALTHY_STATES = frozenset(
    {
        EngineState.LOADING,
        EngineState.READY,
        EngineState.PAUSED,
        EngineState.DRAINING,
        EngineState.UNLOADED,  # keep-alive unload is a deliberate, healthy idle state
    }
)


class Notifier:
    """Sends sd_notify messages; silent when `$NOTIFY_SOCKET` is unset."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        raw = env.get("NOTIFY_SOCKET", "")
        self.address: str | None = None
        if raw.startswith("@"):
            self.address = "\0" + raw[1:]
        elif raw.startswith("/"):
            self.address = raw
        elif raw:
            log.warning("ignoring NOTIFY_SOCKET=%r: not a unix socket path", raw)
        self.watchdog_s = _watchdog_interval_s(env)
        self.sent: list[str] = []

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def notify(self, *lines: str) -> bool:
        """Send one datagram; returns False (and logs) on failure, never raises."""
        if self.address is None:
            return False
        payload = "\n".join(lines)
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                # Never block: this runs on the server's event loop, and a receiver that
                # stops reading would otherwise freeze every request (found in e2e tests).
                sock.setblocking(False)
                sock.sendto(payload.encode(), self.address)
        except BlockingIOError:
            log.debug("sd_notify receiver is not reading; dropped %r", payload)
            return False
        except OSError as exc:
            log.warning("sd_notify failed: %s", exc)
            return False
        self.sent.append(payload)
        return True

    def ready(self, status: str = "serving") -> bool:
        return self.notify("READY=1", f"STATUS={status}", f"MAINPID={os.getpid()}")

    def stopping(self, status: str = "draining") -> bool:
        return self.notify("STOPPING=1", f"STATUS={status}")

    def status(self, text: str) -> bool:
        return self.notify(f"STATUS={text}")

    def watchdog(self) -> bool:
        return self.notify("WATCHDOG=1")


def _watchdog_interval_s(env: Mapping[str, str]) -> float | None:
    """Half of WatchdogSec (systemd's advice), if the watchdog is on and meant for this process."""
    usec = env.get("WATCHDOG_USEC")
    if not usec or not usec.isdigit() or int(usec) == 0:
        return None
    pid = env.get("WATCHDOG_PID")
    if pid and pid.isdigit() and int(pid) != os.getpid():
        return None
    return int(usec) / 1e6 / 2


def engine_healthy(stats: EngineStats, now_s: float, stall_s: float) -> tuple[bool, str]:
    """Healthy if it stepped within `stall_s`, or has nothing to do, or is paused on purpose."""
    if stats.state not in HEALTHY_STATES:
        return False, f"engine {stats.state.value}"
    if stats.state is EngineState.PAUSED or stats.knobs.paused:
        return True, "paused"
    if stats.state in (EngineState.LOADING, EngineState.UNLOADED):
        return True, stats.state.value  # a keep-alive reload may take long; requests wait for it
    busy = stats.active + stats.parked + stats.waiting > 0
    if not busy:
        return True, "idle"
    age_s = now_s - stats.last_progress_s
    if age_s <= stall_s:
        return True, "progressing"
    return False, f"no engine step for {age_s:.1f} s with {stats.active + stats.waiting} requests"


async def watchdog_loop(
    notifier: Notifier,
    engine: EngineLike,
    clock: Callable[[], float],
    stall_s: float,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    max_beats: int | None = None,
    probes_pass: Callable[[], bool] = lambda: True,
) -> int:
    """Ping while healthy; runs on the server's event loop so a blocked loop also stops pings.

    Returns the number of pings sent (when `max_beats` bounds it, for tests).
    """
    interval_s = notifier.watchdog_s or 0.0
    if interval_s <= 0:
        return 0
    beats = loops = 0
    was_healthy = True
    while max_beats is None or loops < max_beats:
        loops += 1
        try:
            ok, why = engine_healthy(engine.stats(), clock(), stall_s)
        except Exception as exc:  # stats() itself failing is unhealthy
            ok, why = False, f"engine stats failed: {exc!r}"
        if ok and not probes_pass():  # the last inference probe got no token (api/health_probe.py)
            ok, why = False, "the last inference probe failed"
        if ok:
            notifier.watchdog()
            beats += 1
        elif was_healthy:
            log.error("watchdog: withholding heartbeat: %s", why)
            notifier.status(f"unhealthy: {why}")
        was_healthy = ok
        await sleep(interval_s)
    return beats
