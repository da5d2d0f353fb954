"""`edge rm NAME`: remove a model from the store."""

from __future__ import annotations

import argparse

from edge.commands._common import add_settings_args, settings_from_args
from edge.store import ModelStore


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("rm", help="remove a pulled model")
    p.add_argument("model", help="store name (see edge ls)")
    add_settings_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    path = ModelStore(settings.models_dir).remove(args.model)
    print(f"removed {args.model} ({path})")
    return 0
