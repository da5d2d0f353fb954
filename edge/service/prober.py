"""The periodic inference probe: while the server is idle, one real token every `probe_interval_s`
(`edge.api.health_probe`), so an engine that hangs while nobody uses it is found by the systemd
watchdog (fed only while probes pass) rather than by the next user. A probe is not use: the
probed model's keep-alive timer is put back as it was, so probes never keep an idle model
resident."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from edge.api.health_probe import pick_model, probe
from edge.api.leases import lease_list
from edge.api.probe_record import ProbeResult
from edge.api.state import ApiState, ServerState

log = logging.getLogger("edge.probe")


class _Scope:
    """What `ApiState.for_model` needs of a request: a scope to record the probe's lease in
    (`api/leases.lease_list`), given back as `LeaseMiddleware` gives back a request's."""

    def __init__(self) -> None:
        self.scope: dict[str, Any] = {"state": {}}

    def release(self) -> None:
        for lease in lease_list(self):
            lease.release()


async def probe_idle(st: ApiState) -> ProbeResult | None:
    """One probe if nothing is in flight (None otherwise); recorded in `st.probes`."""
    if st.in_flight or st.server_state is not ServerState.SERVING:
        return None
    scope = _Scope()
    key = pick_model(st)
    expires_s = st.host.expires_in_s(key) if st.host is not None and key is not None else None
    t0_s = time.monotonic()
    try:
        result = await probe(st, scope, key, st.settings.probe_timeout_s)
    finally:
        scope.release()
    if st.host is not None and key is not None and expires_s is not None:
        st.host.keep_expiry(key, expires_s - (time.monotonic() - t0_s))
    if not result.ok:
        log.error("inference probe failed on %s: %s", result.model, result.detail)
    return st.probes.add(result)


async def probe_loop(st: ApiState, interval_s: float,
                     sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                     max_rounds: int | None = None) -> int:
    """Probe every `interval_s` while idle; returns the probes run (bounded by `max_rounds`, tests)."""
    rounds = ran = 0
    while max_rounds is None or rounds < max_rounds:
        rounds += 1
        await sleep(interval_s)
        try:
            ran += await probe_idle(st) is not None
        except Exception as exc:  # an error here is a failed probe, never a dead prober
            log.error("inference probe raised: %r", exc)
            st.probes.add(ProbeResult(False, None, None, f"probe raised: {exc!r}", time.time()))
    return ran
