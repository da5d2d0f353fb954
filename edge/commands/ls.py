"""`edge ls [--json]`: models in the store."""

from __future__ import annotations

import argparse
import json

from edge.commands._common import add_settings_args, settings_from_args
from edge.store import ModelStore, describe


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ls", help="list pulled models")
    p.add_argument("--json", action="store_true", help="print a JSON list")
    add_settings_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    models = ModelStore(settings.models_dir).list()
    if args.json:
        print(json.dumps(describe(models), indent=2))
        return 0
    if not models:
        print(f"no models in {settings.models_dir} (try: edge pull {settings.default_model})")
        return 0
    print(f"{'NAME':32} {'SIZE':>9}  {'ARCH':10} {'QUANT':16} SHA256")
    for m in models:
        size = f"{m.size_bytes / 2**20:.0f} MiB"
        print(f"{m.name:32} {size:>9}  {m.arch or '?':10} {m.quant or '?':16} {m.sha256[:12]}")
    return 0
