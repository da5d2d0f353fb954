"""Running the app under uvicorn with edge's lifecycle.

uvicorn's own signal handling stops at once; `EdgeServer` replaces it:
first SIGTERM/SIGINT -> STOPPING=1, drain (ready -> 503, running requests get
`drain_timeout_s`), then uvicorn's normal shutdown; a second signal exits at
once. It also sends READY=1 once the engine is loaded and the socket is
listening, and runs the watchdog on the server's own event loop.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import time
from types import FrameType
from typing import Any

import uvicorn

from edge.api.sse import warm_first_answer
from edge.api.state import ApiState
from edge.runtime.types import EngineLike, EngineState
from edge.service.agent import AgentServer
from edge.service.drain import DrainResult, drain
from edge.service.notify import Notifier, watchdog_loop
from edge.service.prober import probe_loop

log = logging.getLogger(__name__)


class EdgeServer(uvicorn.Server):
    def __init__(
        self,
        config: uvicorn.Config,
        state: ApiState,
        engine: EngineLike,
        notifier: Notifier,
        *,
        drain_timeout_s: float,
        stall_s: float = 60.0,
        agent: AgentServer | None = None,
    ) -> None:
        super().__init__(config)
        self.state = state
        self.engine = engine
        self.notifier = notifier
        self.drain_timeout_s = drain_timeout_s
        self.stall_s = stall_s
        self.agent = agent  # the HAProxy agent check, on this loop: it keeps answering "drain" while draining
        self.drain_requested = False
        self.drain_result: DrainResult | None = None
        self.ready_sent = False
        self.exit_code = 0
        self._tasks: list[asyncio.Task[Any]] = []

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """Signal handler: the first signal asks for a drain, the second forces exit.

        Unlike uvicorn's, it does not re-raise the signal after shutdown, so a
        drained server exits 0 (what systemd expects after SIGTERM).
        """
        if self.drain_requested or self.should_exit:
            log.warning("second signal %s: exiting now", signal.Signals(sig).name)
            self.state.cancel_all()
            self.force_exit = True
            self.should_exit = True
        else:
            log.info("signal %s: draining", signal.Signals(sig).name)
            self.drain_requested = True

    def fail(self, reason: str) -> None:
        """The engine could not start: exit non-zero so systemd restarts us."""
        log.error("%s", reason)
        self.notifier.status(f"failed: {reason}")
        self.exit_code = 1
        self.should_exit = True

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.engine.state is not EngineState.READY:
            warm_first_answer()  # the loop is idle until the model is in: the first answer's imports
        if self.agent is not None and not self.should_exit:
            try:
                await self.agent.start()
            except OSError as exc:
                self.fail(f"agent check on {self.agent.host}:{self.agent.port}: {exc}")
        if self.notifier.watchdog_s:
            self._tasks.append(asyncio.create_task(watchdog_loop(
                self.notifier, self.engine, time.monotonic, self.stall_s,
                probes_pass=lambda: self.state.probes.passing)))
        interval_s = self.state.settings.probe_interval_s
        if interval_s > 0:
            self._tasks.append(asyncio.create_task(probe_loop(self.state, interval_s)))

    async def on_tick(self, counter: int) -> bool:
        if self.drain_requested and not any(t.get_name() == "drain" for t in self._tasks):
            self._tasks.append(asyncio.create_task(self._drain(), name="drain"))
        # UNLOADED: a model host with nothing resident yet (`--lazy`) serves by loading on demand
        if not self.ready_sent and self.started and self.engine.state in (EngineState.READY,
                                                                          EngineState.UNLOADED):
            self.ready_sent = True
            self.notifier.ready(f"serving {self.state.model_id}")
            log.info("ready: serving %s", self.state.model_id)
        if self.engine.state is EngineState.FAILED and not self.should_exit:
            self.fail("engine failed")
        return await super().on_tick(counter)

    async def _drain(self) -> None:
        self.notifier.stopping()
        self.drain_result = await drain(self.state, self.drain_timeout_s)
        log.info("drain done: %s", self.drain_result)
        self.should_exit = True

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if not self.drain_requested:  # e.g. engine failure: still say we are stopping
            self.notifier.stopping("stopping")
        self.state.cancel_all()
        await super().shutdown(sockets=sockets)
        if self.agent is not None:
            await self.agent.close()
        for t in self._tasks:
            t.cancel()


def make_config(app: Any, host: str, port: int, log_level: str = "info") -> uvicorn.Config:
    """uvicorn settings: our signal handling, no access log of prompts, short keep-alive."""
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        access_log=False,
        timeout_graceful_shutdown=10,
        lifespan="off",
        log_config=None,  # keep the CLI's logging setup
        server_header=False,
        ws="none",  # edge serves no WebSocket route: importing a websockets stack costs each start ~50 ms
    )
