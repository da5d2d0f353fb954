"""`edge bench engine` and `edge bench http`.

`engine` measures the engine against a bare llama_decode loop (and llama.cpp's own
llama-bench when built), each in its own process with the user's environment, and
prints the ratios the project tracks (see `edge/tools/bench.py`). Exit status 0
whatever the figures: a benchmark reports, it does not judge.

`http` load-tests an OpenAI-compatible server over loopback with a closed-loop
concurrency ladder (the logic is in `edge/bench/`). Exit status: 0 all requests
succeeded; 1 the bench ran but some requests failed (the figures are still
printed and written); 2 usage or config error (bad distribution spec, non-loopback
or unreachable URL, unknown model); 3 a server the bench had to start did not
come up.

`http MODEL --slots-sweep 1,2,4,8 --target-p90-ttft-ms T` starts edge once per slots setting,
runs the ladder on each and recommends `--slots` and `--max-queue` (`edge/bench/sweep.py`,
the rule in `edge/bench/recommend.py`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from edge.commands._common import add_settings_args, settings_from_args

SETTLE_COMPARE_S = 2.0  # a reading, contention_up_s (0.25 s) and margin: see _settle_s


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmark the runtime")
    what = p.add_subparsers(dest="bench_target", metavar="TARGET")
    e = what.add_parser("engine", help="engine vs bare llama_decode loop, batching, prefix reuse")
    e.add_argument("--model", default=None, help="model path or store name (default: settings.default_model)")
    e.add_argument("--threads", type=int, default=2, help="decode threads (default 2)")
    e.add_argument("--tokens", type=int, default=128, help="tokens generated per stream (default 128)")
    e.add_argument("--rounds", type=int, default=2, help="alternating rounds; the best is kept (default 2)")
    e.add_argument("--llama-bench", type=Path, default=None,
                   help="llama.cpp's llama-bench binary for the prompt comparison "
                        "(default .cache/llamacpp-tools/bin/llama-bench: scripts/build_llamacpp_tools.sh)")
    e.add_argument("--json", action="store_true", help="print one JSON object")
    add_settings_args(e)
    e.set_defaults(func=run)
    h = what.add_parser("http", help="load-test an OpenAI-compatible server: concurrency ladder, P50/P90/P99")
    add_load_args(h)
    h.add_argument("--json", dest="json_out", default=None, metavar="FILE",
                   help="write the whole run as one JSON document to FILE ('-': stdout)")
    h.set_defaults(func=run_http)
    p.set_defaults(func=lambda _args: (p.print_help(), 2)[1])


def run(args: argparse.Namespace) -> int:
    from edge.store import resolve_model
    from edge.tools.bench import DEFAULT_LLAMA_BENCH, run_bench

    settings = settings_from_args(args)
    path = resolve_model(args.model or settings.default_model, settings)
    report = run_bench(path, n_threads=args.threads, n_tokens=args.tokens, rounds=args.rounds,
                       llama_bench_path=args.llama_bench or DEFAULT_LLAMA_BENCH)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(report.table())
    return 0


# --- edge bench http ------------------------------------------------------------------


def add_load_args(p: argparse.ArgumentParser) -> None:
    """The load-test flags, shared by `edge bench http` and `edge report`."""
    p.add_argument("model", nargs="?", default=None,
                   help="store name or .gguf path: start `edge serve MODEL` on loopback and measure it "
                        "(with --url: the model file for servers --compare starts)")
    p.add_argument("--url", default=None, help="measure a server already running at URL (loopback only)")
    p.add_argument("--allow-remote", action="store_true", help="allow a non-loopback --url or --compare URL")
    p.add_argument("--concurrency", default="1,2,4,8", help="ladder of concurrent clients (default 1,2,4,8)")
    p.add_argument("--requests", type=int, default=None,
                   help="measured requests per step, after warmup (default 32 unless --duration)")
    p.add_argument("--duration", type=float, default=None, help="stop starting requests after S s per step")
    p.add_argument("--warmup", type=int, default=None,
                   help="unmeasured requests first in each step (default: C)")
    p.add_argument("--prompt-lengths", default="uniform:32-256",
                   help="fixed:N, uniform:A-B (about N tokens of words) or jsonl:PATH of real requests "
                        "(default uniform:32-256)")
    p.add_argument("--workload", choices=("words", "story", "summarise", "rewrite", "quote"), default="words",
                   help="words: prompts of random words (--prompt-lengths); story: free-form writing; "
                        "summarise / rewrite / quote: answers that repeat a given document, code or passage")
    p.add_argument("--max-tokens", default="uniform:32-128",
                   help="fixed:N or uniform:A-B (default uniform:32-128)")
    p.add_argument("--endpoint", choices=("chat", "completions"), default="chat",
                   help="/v1/chat/completions (default) or /v1/completions")
    p.add_argument("--compare", action="append", default=[], metavar="TARGET",
                   help="also measure TARGET, interleaved step by step: a URL, edge, llama-server or "
                        "llama-cpp-python (repeatable)")
    p.add_argument("--threads", type=int, default=None,
                   help="threads of the servers the bench starts (default: usable CPUs)")
    p.add_argument("--slots", type=int, default=4,
                   help="parallel sequences of the servers the bench starts (default 4)")
    p.add_argument("--slots-sweep", default=None, metavar="LIST",
                   help="with MODEL: start edge once per slots setting (e.g. 1,2,4,8), run the ladder "
                        "on each and recommend --slots and --max-queue (needs --target-p90-ttft-ms)")
    p.add_argument("--target-p90-ttft-ms", type=float, default=None, metavar="MS",
                   help="the sweep's latency target: the most tokens/s whose P90 TTFT stays within MS")
    p.add_argument("--ctx", type=int, default=4096,
                   help="context tokens of the servers the bench starts (default 4096)")
    p.add_argument("--timeout", type=float, default=300.0,
                   help="limit for one whole request in seconds (default 300)")
    p.add_argument("--ready-timeout", type=float, default=300.0,
                   help="seconds a started server gets to become ready (default 300)")
    p.add_argument("--seed", type=int, default=0, help="seed of the request mix (default 0)")
    p.add_argument("--settle", type=float, default=None, metavar="S",
                   help="idle seconds before each step, so the servers' start and one target's "
                        "load are gone before the next step starts "
                        f"(default {SETTLE_COMPARE_S:g} with --compare, else 0)")
    p.add_argument("--ignore-eos", action="store_true",
                   help="ban the model's end tokens (logit_bias -100) so every answer is max_tokens long "
                        "on every target: decode speed compared like for like")
    add_settings_args(p)


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def _ladder(text: str) -> tuple[int, ...]:
    from edge.errors import ConfigError

    try:
        values = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise ConfigError("concurrency", f"{text!r}: expected integers like 1,2,4,8") from None
    if not values or values[0] < 1 or values[-1] > 1024:
        raise ConfigError("concurrency", f"{text!r}: each value must be between 1 and 1024")
    return tuple(values)


def _positive(name: str, value: float | None, zero_ok: bool = False) -> None:
    from edge.errors import ConfigError

    if value is not None and (value < 0 or (value == 0 and not zero_ok)):
        raise ConfigError(name, f"must be {'0 or more' if zero_ok else 'positive'}, not {value}")


def bench_config(args: argparse.Namespace) -> Any:
    """A BenchConfig from the flags; ConfigError for anything wrong, before any server starts."""
    from edge.bench.runner import BenchConfig
    from edge.bench.targets import TargetSpec, check_loopback, llama_server_binary, parse_target
    from edge.commands.inspect import resolve_model_path
    from edge.errors import ConfigError

    for name in ("requests", "threads", "slots", "ctx", "timeout", "ready_timeout", "duration"):
        _positive(name.replace("_", "-"), getattr(args, name))
    _positive("warmup", args.warmup, zero_ok=True)
    settle = getattr(args, "settle", None)
    _positive("settle", settle, zero_ok=True)
    if args.url is None and args.model is None:
        raise ConfigError("target", "give a MODEL to start, or --url of a running server")
    model_path = None if args.model is None else Path(resolve_model_path(args.model, args)).resolve()
    if args.url is not None:
        check_loopback(args.url, args.allow_remote)
        primary = TargetSpec("url", "url", args.url.rstrip("/"))
    else:
        primary = TargetSpec("edge", "edge")
    compare = tuple(parse_target(c) for c in args.compare)
    for c in compare:
        if c.url is not None:
            check_loopback(c.url, args.allow_remote)
        elif model_path is None:
            raise ConfigError("compare", f"starting {c.kind} needs MODEL (a store name or .gguf path)")
        elif c.kind == "llama-server":
            llama_server_binary()  # missing: a usage error now, not after the first server started
    sweep = _slots_sweep(args, compare)
    requests = args.requests if args.requests is not None or args.duration is not None else 32
    cfg = BenchConfig(
        primary=primary, compare=compare, model=args.model, model_path=model_path,
        concurrency=_ladder(args.concurrency), requests=requests, duration_s=args.duration,
        warmup=args.warmup, prompt_lengths=args.prompt_lengths, max_tokens=args.max_tokens,
        endpoint=args.endpoint, timeout_s=args.timeout, threads=args.threads or _usable_cpus(),
        slots=args.slots, ctx=args.ctx, seed=args.seed, allow_remote=args.allow_remote,
        ban_tokens=_end_tokens(args, model_path), task=getattr(args, "workload", "words"),
        settle_s=_settle_s(settle, bool(compare)), slots_sweep=sweep,
        target_p90_ttft_ms=getattr(args, "target_p90_ttft_ms", None),
    )
    cfg.workload()  # parse the distributions now: a bad spec is a usage error (2)
    return cfg


def _slots_sweep(args: argparse.Namespace, compare: tuple[Any, ...]) -> tuple[int, ...]:
    """The --slots-sweep values, () without it; a sweep needs a MODEL to start (a live server cannot
    change its slots), measures edge alone, and needs the target its recommendation is for."""
    from edge.errors import ConfigError

    text, target = getattr(args, "slots_sweep", None), getattr(args, "target_p90_ttft_ms", None)
    if text is None:
        if target is not None:
            raise ConfigError("target-p90-ttft-ms", "only with --slots-sweep")
        return ()
    if args.url is not None or args.model is None:
        raise ConfigError("slots-sweep", "a running server cannot change its slots: give a MODEL for the "
                                         "bench to start once per setting, not --url")
    if compare:
        raise ConfigError("slots-sweep", "the sweep measures edge alone: drop --compare")
    if target is None:
        raise ConfigError("slots-sweep", "give --target-p90-ttft-ms MS: the recommendation is the most "
                                         "tokens/s within it")
    _positive("target-p90-ttft-ms", target)
    try:
        values = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise ConfigError("slots-sweep", f"{text!r}: expected integers like 1,2,4,8") from None
    if not values or values[0] < 1 or values[-1] > 64:
        raise ConfigError("slots-sweep", f"{text!r}: each value must be between 1 and 64 (edge's --slots)")
    return tuple(values)


def _settle_s(given: float | None, comparing: bool) -> float:
    """The pause between steps: edge's contention stage restores decode threads once the cores
    have been free for a reading and `contention_up_s` (under a second), so a target measured
    right after another one's load would otherwise start on fewer threads than a user gets."""
    if given is not None:
        return given
    return SETTLE_COMPARE_S if comparing else 0.0


def _end_tokens(args: argparse.Namespace, model_path: Path | None) -> tuple[int, ...]:
    if not getattr(args, "ignore_eos", False):
        return ()
    from edge.bench.workload import end_tokens
    from edge.errors import ConfigError

    if model_path is None:
        raise ConfigError("ignore-eos", "--ignore-eos needs the MODEL file to know its end tokens")
    return end_tokens(model_path)


def run_ladder(args: argparse.Namespace, *, progress: bool, launcher: Any = None) -> dict[str, Any]:
    """The bench document for these flags (raises the typed errors `commands.exits` maps)."""
    from edge.bench.runner import run_bench

    if not getattr(args, "verbose", False):  # one INFO line per request would bury the table
        for name in ("httpx", "httpcore"):
            logging.getLogger(name).setLevel(logging.WARNING)

    cfg = bench_config(args)
    kw = {} if launcher is None else {"launcher": launcher}
    if cfg.slots_sweep:
        from edge.bench.sweep import run_sweep

        return run_sweep(cfg, progress=progress, ready_timeout_s=args.ready_timeout, **kw)
    return run_bench(cfg, progress=progress, ready_timeout_s=args.ready_timeout, **kw)


def reported(exc: Exception) -> int:
    """Print a bench/report error and return its exit status; re-raise one that is not ours."""
    from edge.commands.exits import EXIT_FAILED, exit_status
    from edge.errors import EdgeError

    code = exit_status(exc) if isinstance(exc, EdgeError) else EXIT_FAILED
    if code == EXIT_FAILED:
        raise exc
    print(f"edge: error: {exc}", file=sys.stderr)
    return code


def run_http(args: argparse.Namespace) -> int:
    from edge.bench.table import render
    from edge.commands.exits import EXIT_FAILED as EXIT_REQUESTS_FAILED
    from edge.commands.exits import EXIT_OK
    from edge.errors import EdgeError

    to_stdout = args.json_out == "-"
    try:
        doc = run_ladder(args, progress=sys.stderr.isatty() and not to_stdout)
    except EdgeError as exc:
        return reported(exc)
    table = render(doc)
    if to_stdout:
        print(json.dumps(doc, indent=2))
        print(table, file=sys.stderr)
    else:
        print(table)
        if args.json_out is not None:
            Path(args.json_out).write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    return EXIT_REQUESTS_FAILED if doc["failed_requests"] else EXIT_OK
