"""`edge bench engine [--model M] [--threads 2] [--tokens 128] [--json]`.

Measures the engine against a bare llama_decode loop in one run and prints the
four ratios the project tracks (see `edge/runtime/bench.py`). Exit status 0
whatever the figures: a benchmark reports, it does not judge.
"""

from __future__ import annotations

import argparse
import json

from edge.commands._common import add_settings_args, settings_from_args


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmark the runtime")
    what = p.add_subparsers(dest="bench_target", metavar="TARGET")
    e = what.add_parser("engine", help="engine vs bare llama_decode loop, batching, prefix reuse")
    e.add_argument("--model", default=None, help="model path or store name (default: settings.default_model)")
    e.add_argument("--threads", type=int, default=2, help="decode threads (default 2)")
    e.add_argument("--tokens", type=int, default=128, help="tokens generated per stream (default 128)")
    e.add_argument("--rounds", type=int, default=2, help="alternating rounds; the best is kept (default 2)")
    e.add_argument("--json", action="store_true", help="print one JSON object")
    add_settings_args(e)
    e.set_defaults(func=run)
    p.set_defaults(func=lambda _args: (p.print_help(), 2)[1])


def run(args: argparse.Namespace) -> int:
    from edge.runtime.bench import run_bench
    from edge.store import resolve_model

    settings = settings_from_args(args)
    path = resolve_model(args.model or settings.default_model, settings)
    report = run_bench(path, n_threads=args.threads, n_tokens=args.tokens, rounds=args.rounds)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(report.table())
    return 0
