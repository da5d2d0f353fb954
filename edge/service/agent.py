"""HAProxy agent check: a TCP port that answers every connection with one line and closes.

HAProxy (`server ... agent-check agent-port N agent-inter 1s`) connects, reads one
ASCII line such as `up 60%`, `drain` or `down #loading model`, and applies it: the
percentage scales the server's configured weight, `drain` stops new requests while
running ones finish, `down` takes it out until a later `up`. The answer comes from
`ApiState.balancer_weight()` (a pure function of the scheduler's headroom and the
queue, edge.scheduler.headroom); this module only moves bytes. It runs on the HTTP
server's own event loop, so it stays up while the server drains and closes with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from edge.config import Settings
from edge.errors import ConfigError
from edge.scheduler.headroom import AgentState, AgentWeight
from edge.service.launch import is_loopback

log = logging.getLogger(__name__)

ANNOUNCE_READY_S = 30.0  # say `ready` this long after start (see AgentWeight.line)
WRITE_TIMEOUT_S = 2.0


def agent_bind(settings: Settings, keyed: bool) -> tuple[str, int] | None:
    """(host, port) for the agent, None when off; a non-loopback host needs an API key (`keyed`)
    or --insecure, as the API's own bind does."""
    if settings.agent_port is None:
        return None
    host = settings.agent_host or "127.0.0.1"
    if not is_loopback(host) and not keyed:
        if not settings.insecure:
            raise ConfigError(
                "agent_host",
                f"the agent check on {host} tells anyone on the network this box's load; set an API key "
                "(--api-key-file FILE or EDGE_API_KEY) or pass --insecure, or keep it on 127.0.0.1",
            )
        log.warning("agent check on %s without an API key (--insecure)", host)
    return host, settings.agent_port


class AgentServer:
    """The asyncio TCP server; `weight` is called once per connection."""

    def __init__(self, weight: Callable[[], AgentWeight], host: str, port: int,
                 clock: Callable[[], float] = time.monotonic,
                 announce_ready_s: float = ANNOUNCE_READY_S) -> None:
        self.weight = weight
        self.host, self.port = host, port
        self.clock = clock
        self.announce_ready_s = announce_ready_s
        self.answers = 0
        self.last: AgentWeight | None = None
        self._server: asyncio.base_events.Server | None = None
        self._started_s = clock()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._answer, self.host, self.port)
        self.port = int(self._server.sockets[0].getsockname()[1])  # port 0: the one chosen
        self._started_s = self.clock()
        log.info("agent check on %s:%d", self.host, self.port)

    def reply(self) -> str:
        """The line for this moment (what a connection gets, without the newline)."""
        try:
            w = self.weight()
        except Exception as exc:  # never answer with a traceback; the balancer reads "down"
            log.warning("agent weight failed: %s", exc)
            w = AgentWeight(AgentState.DOWN, 0, f"weight unavailable: {type(exc).__name__}")
        if self.last is None or (w.state, w.weight_pct) != (self.last.state, self.last.weight_pct):
            log.info("agent: %s (%s)", w.line(), w.reason)
        self.last = w
        return w.line(announce_ready=self.clock() - self._started_s < self.announce_ready_s)

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # HAProxy may send `agent-send` text first; nothing here depends on it, so it is not read
        try:
            writer.write((self.reply() + "\n").encode("ascii"))
            await asyncio.wait_for(writer.drain(), WRITE_TIMEOUT_S)
            self.answers += 1
        except (OSError, TimeoutError) as exc:
            log.debug("agent answer failed: %s", exc)
        finally:
            writer.close()
            with contextlib.suppress(OSError, TimeoutError):
                await asyncio.wait_for(writer.wait_closed(), WRITE_TIMEOUT_S)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), WRITE_TIMEOUT_S)
            self._server = None
