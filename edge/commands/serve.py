"""`edge serve [MODEL]`: the OpenAI-compatible HTTP server (see README "Serving")."""

from __future__ import annotations

import argparse
import logging
import threading
from pathlib import Path

from edge.commands._common import add_settings_args, settings_from_args
from edge.config import DEFAULT_PROMPT_CACHE_MIB
from edge.runtime.types import EngineLike
from edge.service.launch import bind_api_key, build_scheduler, choose_model, open_engine, plan_of

log = logging.getLogger("edge.serve")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API")
    p.add_argument("model", nargs="?", default=None, help="store name or .gguf path (default: default_model)")
    p.add_argument("--host", default=None, help="bind address (default 127.0.0.1; others need an API key)")
    p.add_argument("--port", type=int, default=None, help="TCP port (default 8088)")
    p.add_argument("--slots", type=int, default=None, help="sequences decoded together")
    p.add_argument("--threads", type=int, default=None, help="decode threads")
    p.add_argument("--max-queue", type=int, default=None, help="requests allowed to wait (beyond: 503)")
    p.add_argument("--ctx", type=int, default=None, help="context length in tokens")
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
    p.add_argument("--api-key-file", type=Path, default=None, help="file holding the bearer API key")
    p.add_argument(
        "--insecure", action="store_true", default=None, help="allow a non-loopback bind without an API key"
    )
    p.add_argument(
        "--drain-timeout", type=float, default=None, help="seconds running requests get on SIGTERM"
    )
    p.add_argument(
        "--chat-template", default=None, metavar="NAME|FILE",
        help="replace the model's chat template: chatml, chatml-tools (adds tool calling), llama3, plain, "
        "or a Jinja file",
    )
    p.add_argument("--embedding-model", default=None, metavar="MODEL",
                   help="a second model for /v1/embeddings (default: the served model's own weights)")
    p.add_argument("--agent-port", type=int, default=None,
                   help="HAProxy agent check port: answers the box's weight from its headroom (default off)")
    p.add_argument("--agent-host", default=None,
                   help="agent check bind address (default 127.0.0.1; others need an API key)")
    p.add_argument("--sim-ambient-file", type=Path, default=None,
                   help="with --telemetry sim:..., a file holding the room temperature in C "
                   "(re-read as it changes)")
    p.add_argument("--speculative", choices=("off", "ngram", "draft"), default=None,
                   help="speculative decoding (default ngram: adaptive prompt lookup; draft: --draft-model)")
    p.add_argument("--draft-model", default=None, metavar="MODEL",
                   help="draft model for --speculative draft (same vocabulary as the served model)")
    p.add_argument("--draft-max", type=int, default=None, metavar="K", help="most tokens drafted per step")
    p.add_argument("--prompt-cache-mib", type=int, default=None, metavar="MIB",
                   help="host memory for idle prompt caches moved out of the KV cache "
                   f"(default {DEFAULT_PROMPT_CACHE_MIB}; 0: off)")
    p.add_argument("--flash-attn", choices=("auto", "on", "off", "fastest"), default=None,
                   help="flash attention (default auto: llama.cpp's choice; fastest: timed both ways on "
                   "this device once and the faster kept, greedy output may then vary with batching)")
    p.add_argument("--no-scheduler", action="store_true", help="plain bounded queue, no thermal control")
    add_settings_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from edge.api.app import create_app
    from edge.service.agent import AgentServer, agent_bind
    from edge.service.notify import Notifier
    from edge.service.server import EdgeServer, make_config

    settings = settings_from_args(
        args,
        host=args.host,
        port=args.port,
        slots=args.slots,
        threads=args.threads,
        max_queue=args.max_queue,
        n_ctx=args.ctx,
        profile=args.profile,
        telemetry=args.telemetry,
        calibration=args.calibration,
        power_budget_w=args.power_budget_w,
        battery_reserve_pct=args.battery_reserve_pct,
        battery_power_budget_w=args.battery_power_budget_w,
        sysfs_root=args.sysfs_root,
        procfs_root=args.procfs_root,
        api_key_file=args.api_key_file,
        insecure=args.insecure,
        drain_timeout_s=args.drain_timeout,
        chat_template=args.chat_template,
        embedding_model=args.embedding_model,
        agent_port=args.agent_port,
        agent_host=args.agent_host,
        sim_ambient_file=args.sim_ambient_file,
        speculative=args.speculative,
        draft_model=args.draft_model,
        draft_max=args.draft_max,
        flash_attn=args.flash_attn,
        prompt_cache_mib=args.prompt_cache_mib,
    )
    api_key = bind_api_key(settings)
    agent_at = agent_bind(settings, keyed=api_key is not None)
    choice = choose_model(args.model, settings)
    engine = open_engine(choice.path, settings)
    scheduler = None if args.no_scheduler else build_scheduler(settings, engine)
    app = create_app(
        settings,
        engine,
        scheduler,
        model_id=choice.model_id,
        model_aliases=choice.aliases,
        api_key=api_key or "",
        plan=plan_of(engine, choice.path, settings),
        model_path=choice.path,
    )
    notifier = Notifier()
    state = app.state.edge
    agent = None if agent_at is None else AgentServer(state.balancer_weight, *agent_at)
    server = EdgeServer(
        make_config(
            app, settings.host, settings.port, "debug" if getattr(args, "verbose", False) else "info"
        ),
        app.state.edge,
        engine,
        notifier,
        drain_timeout_s=settings.drain_timeout_s,
        agent=agent,
    )
    stop = threading.Event()
    loader = threading.Thread(
        target=_load, args=(engine, scheduler, stop, server), name="edge-load", daemon=True
    )
    loader.start()
    log.info(
        "serving %s on http://%s:%d (auth %s)",
        choice.path,
        settings.host,
        settings.port,
        "on" if api_key else "off",
    )
    try:
        server.run()
    finally:
        stop.set()
        engine.stop(0.0)
        loader.join(timeout=5.0)
    return server.exit_code


def _load(engine: EngineLike, scheduler: object, stop: threading.Event, server: object) -> None:
    """Load the model while the HTTP side already answers /health and /ready (503 loading)."""
    try:
        engine.start()
    except Exception as exc:
        server.fail(f"model load failed: {exc}")  # type: ignore[attr-defined]
        return
    if scheduler is not None and not stop.is_set():
        scheduler.start_thread(stop)  # type: ignore[attr-defined]
