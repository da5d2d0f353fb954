"""`edge serve [MODEL]`: the OpenAI-compatible HTTP server (see README "Serving")."""

from __future__ import annotations

import argparse
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edge.commands._common import add_ops_args, add_settings_args, settings_from_args
from edge.commands.deployments import record_start
from edge.config import Settings
from edge.contracts.options import (
    DEFAULT_DRAFT_MAX,
    DEFAULT_FLASH_ATTN,
    DEFAULT_PROMPT_CACHE_MIB,
    DEFAULT_REASONING_BUDGET,
    DEFAULT_REASONING_FORMAT,
    DEFAULT_SLOTS,
    DEFAULT_SPECULATIVE,
    FLASH_ATTN_KINDS,
    REASONING_FORMATS,
    SPECULATIVE_MODES,
)
from edge.runtime.types import EngineLike
from edge.service.launch import bind_api_key, build_scheduler, open_host

log = logging.getLogger("edge.serve")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API")
    p.add_argument("model", nargs="*", default=None,
                   help="models to load at start: store names or .gguf paths (default: default_model); "
                   "every model in the store is served too, loaded on first use")
    _add_server_args(p)
    _add_host_args(p)
    _add_device_args(p)
    _add_model_args(p)
    p.add_argument("--no-scheduler", action="store_true", help="plain bounded queue, no thermal control")
    add_ops_args(p)  # --audit-log, --state-dir (read by settings_from_args)
    add_settings_args(p)
    p.set_defaults(func=run)


def _add_server_args(p: argparse.ArgumentParser) -> None:
    """Where and how the HTTP side listens (and the agent check beside it)."""
    p.add_argument("--host", default=None, help="bind address (default 127.0.0.1; others need an API key)")
    p.add_argument("--port", type=int, default=None, help="TCP port (default 8088)")
    p.add_argument("--max-queue", type=int, default=None, help="requests allowed to wait (beyond: 503)")
    p.add_argument("--api-key-file", type=Path, default=None, help="file holding the bearer API key")
    p.add_argument(
        "--insecure", action="store_true", default=None, help="allow a non-loopback bind without an API key"
    )
    p.add_argument(
        "--drain-timeout", type=float, default=None, help="seconds running requests get on SIGTERM"
    )
    p.add_argument("--agent-port", type=int, default=None,
                   help="HAProxy agent check port: answers the box's weight from its headroom (default off)")
    p.add_argument("--agent-host", default=None,
                   help="agent check bind address (default 127.0.0.1; others need an API key)")


def _add_host_args(p: argparse.ArgumentParser) -> None:
    """The model host: what the resident models may hold together, and for how long."""
    p.add_argument("--memory-budget", default=None, metavar="BYTES", dest="memory_budget_bytes",
                   help="memory the resident models may hold together, e.g. 1300M or 4G (default: the "
                   "memory available at start minus the reserve); idle models are unloaded to make room")
    p.add_argument("--keep-alive", default=None, metavar="DURATION", dest="keep_alive_s",
                   help="unload a model after this idle time, e.g. 5m, 1h, 0, -1 for never (default 5m)")
    p.add_argument("--pin", action="append", default=None, metavar="MODEL",
                   help="never unload MODEL, to make room or after idle time (repeatable)")
    p.add_argument("--probe-interval", type=float, default=None, metavar="S", dest="probe_interval_s",
                   help="while idle, a one-token inference probe every S seconds; the systemd watchdog is "
                   "fed only while probes pass (default 60; 0: off)")
    p.add_argument("--probe-timeout", type=float, default=None, metavar="S", dest="probe_timeout_s",
                   help="a probe with no token within S seconds fails: /health/inference 503 (default 10)")
    p.add_argument("--lazy", action="store_true",
                   help="load no model at start (not even the default): each loads on its first request")


def _add_device_args(p: argparse.ArgumentParser) -> None:
    """What the scheduler reads and holds: profile, telemetry, throughput, power."""
    p.add_argument("--profile", default=None, help="device profile in configs/devices")
    p.add_argument(
        "--telemetry",
        default=None,
        help="auto|linux|jetson|macos|none|sim:PROFILE[@SCALE] (PROFILE: a name in configs/devices or "
        "a .toml path; @SCALE compresses time, e.g. sim:jetson-orin-nano@30 = 30 s per wall second)",
    )
    p.add_argument("--calibration", default=None,
                   help="measured throughput (configs/throughput NAME or JSON path) for the thermal ladder")
    p.add_argument("--power-budget", type=float, default=None, metavar="W", dest="power_budget_w",
                   help="power budget in watts the scheduler holds (beats the nvpmodel mode's and profile's)")
    p.add_argument("--battery-power-budget", type=float, default=None, metavar="W",
                   dest="battery_power_budget_w", help="power budget in watts on battery (beats the profile)")
    p.add_argument("--battery-reserve", type=float, default=None, metavar="PCT", dest="battery_reserve_pct",
                   help="on battery below this charge, background work waits (default 20)")
    p.add_argument("--sysfs-root", type=Path, default=None, help="sysfs root to read (tests, containers)")
    p.add_argument("--procfs-root", type=Path, default=None, help="procfs root to read")
    p.add_argument("--sim-ambient-file", type=Path, default=None,
                   help="with --telemetry sim:..., a file holding the room temperature in C "
                   "(re-read as it changes)")


def _add_model_args(p: argparse.ArgumentParser) -> None:
    """How the model runs: slots, threads, context, template, speculation, caches, attention.
    Choices and defaults shown come from edge.contracts.options, as the settings' do."""
    p.add_argument("--slots", type=int, default=None,
                   help=f"sequences decoded together (default {DEFAULT_SLOTS})")
    p.add_argument("--threads", type=int, default=None, help="decode threads")
    p.add_argument("--ctx", type=int, default=None, help="context length in tokens")
    p.add_argument(
        "--chat-template", default=None, metavar="NAME|FILE",
        help="replace the model's chat template: chatml, chatml-tools (adds tool calling), llama3, plain, "
        "or a Jinja file",
    )
    p.add_argument("--embedding-model", default=None, metavar="MODEL",
                   help="a second model for /v1/embeddings (default: the served model's own weights)")
    p.add_argument("--speculative", choices=SPECULATIVE_MODES, default=None,
                   help=f"speculative decoding (default {DEFAULT_SPECULATIVE}: adaptive prompt lookup; "
                   "draft: --draft-model)")
    p.add_argument("--draft-model", default=None, metavar="MODEL",
                   help="draft model for --speculative draft (same vocabulary as the served model)")
    p.add_argument("--draft-max", type=int, default=None, metavar="K",
                   help=f"most tokens drafted per step (default {DEFAULT_DRAFT_MAX})")
    p.add_argument("--prompt-cache-mib", type=int, default=None, metavar="MIB",
                   help="host memory for idle prompt caches moved out of the KV cache "
                   f"(default {DEFAULT_PROMPT_CACHE_MIB}; 0: off)")
    p.add_argument("--flash-attn", choices=FLASH_ATTN_KINDS, default=None,
                   help=f"flash attention (default {DEFAULT_FLASH_ATTN}: llama.cpp's choice; fastest: timed "
                   "both ways on this device once and the faster kept, greedy output may then vary with "
                   "batching)")
    p.add_argument("--reasoning-format", choices=REASONING_FORMATS, default=None,
                   help=f"keep a think block apart from the answer (default {DEFAULT_REASONING_FORMAT}: the "
                   "template's markers; none: the text as written)")
    p.add_argument("--reasoning-budget", type=int, default=None, metavar="N",
                   help=f"thinking tokens before edge closes the block (default {DEFAULT_REASONING_BUDGET}: "
                   "unlimited; shrunk under a thermal or power cut or on a low battery)")


# settings field <- argparse dest, where the two names differ (every other flag has the field's name)
_RENAMED = {"n_ctx": "ctx", "drain_timeout_s": "drain_timeout"}
_SETTINGS_FROM_FLAGS = (
    "host", "port", "slots", "threads", "max_queue", "n_ctx", "profile", "telemetry", "calibration",
    "power_budget_w", "battery_reserve_pct", "battery_power_budget_w", "sysfs_root", "procfs_root",
    "api_key_file", "insecure", "drain_timeout_s", "chat_template", "embedding_model", "agent_port",
    "agent_host", "sim_ambient_file", "speculative", "draft_model", "draft_max", "flash_attn",
    "prompt_cache_mib", "memory_budget_bytes", "keep_alive_s", "pin", "probe_interval_s", "probe_timeout_s",
    "reasoning_format", "reasoning_budget",
)


def settings_of(args: argparse.Namespace) -> Settings:
    """The settings `serve` runs with: every flag given overrides its field (None: not given)."""
    return settings_from_args(args, **{name: getattr(args, _RENAMED.get(name, name))
                                       for name in _SETTINGS_FROM_FLAGS})


def run(args: argparse.Namespace) -> int:
    from edge.service.agent import agent_bind

    settings = settings_of(args)
    api_key = bind_api_key(settings)
    agent_at = agent_bind(settings, keyed=api_key is not None)
    host, first = open_host(args.model or [None], settings, preload=not args.lazy)
    host.import_runtime()  # first: the load's own Python is then short, its C part overlaps what follows
    preload = Preload(host)  # the weights load (in C, the GIL released) while the API is imported
    from edge.runtime.llama.early import EARLY  # here: other commands' parsers import this module

    preload.then(EARLY.finish)  # early loads nobody took closed, this start's loads recorded
    from edge.api.app import create_app

    scheduler = None if args.no_scheduler else build_scheduler(settings, host)
    app = create_app(settings, host, scheduler, model_id=first.model_id, model_aliases=first.aliases,
                     api_key=api_key or "", model_path=first.path, host=host, late_routes=True)
    EARLY.hurry()  # the API is imported: the chat head's priming stops after its chunk (llama/prime.py)
    # deployments/<UTC time>.json, what this start runs: written once the models named have loaded
    # (or failed to) and the first requests had the cores (a first start hashes each model file)
    preload.then(lambda: record_start(settings, [first.path]), after_s=RECORD_AFTER_S)
    preload.then(lambda: _after_start(app))  # what the first token should not wait for
    return _serve(app, settings, preload, scheduler, agent_at, auth=bool(api_key),
                  verbose=bool(getattr(args, "verbose", False)), model_path=first.path)


RECORD_AFTER_S = 3.0  # the deployment record waits this long after the load


def _after_start(app: Any) -> None:
    """Once the start's loads and first requests are done: the routes a first chat answer does
    not need (api.late_routes; a request for one includes them sooner), numpy for greedy sampling
    (a chain samples until then: runtime.llama.sampling.import_numpy), and the garbage collector
    that cli.main paused for the start (edge.gcpause)."""
    from edge.api.late_routes import late_routes_of
    from edge.gcpause import START
    from edge.runtime.llama.sampling import import_numpy

    late = late_routes_of(app)
    if late is not None:
        late.include()
    import_numpy()
    found = START.settle()
    if found:
        log.debug("garbage collector back on: %d unreachable objects from the start", found)


class Preload:
    """`engine.start()` (the models named at start) on its own thread from the moment the host
    exists; `wait()` returns what it raised, if anything. Work given to `then` runs on the same
    thread after the load, so the first token never waits for it."""

    def __init__(self, engine: EngineLike,
                 pause: Callable[[threading.Event, float], object] = threading.Event.wait) -> None:
        self.engine = engine
        self._pause = pause  # (hurry event, seconds): waits before delayed work, cut short by hurry
        self.error: Exception | None = None
        self._loaded = threading.Event()
        self._lock = threading.Lock()
        self._after: list[tuple[Callable[[], object], float]] = []
        self._done = False  # the thread has run out of work: `then` runs its own
        self._hurry = threading.Event()  # the server is ending: no more waiting
        self._thread = threading.Thread(target=self._run, name="edge-preload", daemon=True)
        self._thread.start()

    def then(self, work: Callable[[], object], after_s: float = 0.0) -> None:
        """Run `work` once the load has ended, however it ended, and `after_s` more seconds have
        passed (cut short by `hurry`); on a thread of its own when this one has ended: a load
        that beat the API's imports once made the deployment record run in `serve`'s own
        thread, 0.17 s before the server could listen."""
        with self._lock:
            self._after.append((work, after_s))
            if not self._done:
                return
            self._done = False
            self._thread = threading.Thread(target=self._drain, name="edge-preload", daemon=True)
            self._thread.start()

    def hurry(self, timeout_s: float = 5.0) -> None:
        """The server is ending: run what is queued now, and wait up to `timeout_s` for it."""
        self._hurry.set()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        try:
            self.engine.start()
        except Exception as exc:
            self.error = exc
        self._loaded.set()
        self._drain()

    def _drain(self) -> None:
        while True:
            with self._lock:
                if not self._after:
                    self._done = True
                    return
                work, after_s = self._after.pop(0)
            if after_s > 0:
                self._pause(self._hurry, after_s)
            try:
                work()
            except Exception:  # an afterthought never fails the start
                log.exception("after the model load")

    def wait(self, timeout_s: float | None = None) -> Exception | None:
        """The load's outcome (work queued by `then` may still be running)."""
        self._loaded.wait(timeout_s)
        return self.error


def _serve(app: Any, settings: Settings, preload: Preload, scheduler: object,
           agent_at: tuple[str, int] | None, *,
           auth: bool, verbose: bool, model_path: Path) -> int:
    """Run uvicorn until it stops while the model loads in a thread (so /health answers at once);
    the engine is stopped however the server ends."""
    from edge.service.agent import AgentServer
    from edge.service.notify import Notifier
    from edge.service.server import EdgeServer, make_config

    state, engine = app.state.edge, preload.engine
    agent = None if agent_at is None else AgentServer(state.balancer_weight, *agent_at)
    server = EdgeServer(
        make_config(app, settings.host, settings.port, "debug" if verbose else "info"),
        state,
        engine,
        Notifier(),
        drain_timeout_s=settings.drain_timeout_s,
        agent=agent,
    )
    stop = threading.Event()
    loader = threading.Thread(
        target=_load, args=(preload, scheduler, stop, server), name="edge-load", daemon=True
    )
    loader.start()
    log.info("serving %s on http://%s:%d (auth %s)", model_path, settings.host, settings.port,
             "on" if auth else "off")
    try:
        server.run()
    finally:
        stop.set()
        preload.hurry()  # a short run still leaves its record
        engine.stop(0.0)
        loader.join(timeout=5.0)
    return server.exit_code


def _load(preload: Preload, scheduler: object, stop: threading.Event, server: object) -> None:
    """Wait for the models named at start while the HTTP side already answers /health and /ready
    (503 loading); the server fails when one of them cannot load."""
    error = preload.wait()
    if error is not None:
        server.fail(f"model load failed: {error}")  # type: ignore[attr-defined]
        return
    if scheduler is not None and not stop.is_set():
        scheduler.start_thread(stop)  # type: ignore[attr-defined]
