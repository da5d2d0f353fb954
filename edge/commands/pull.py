"""`edge pull NAME|URL|hf://owner/repo/file.gguf [--sha256 HEX]`."""

from __future__ import annotations

import argparse

from edge.commands._common import add_settings_args, settings_from_args
from edge.store import ModelStore


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("pull", help="download a model into the store")
    p.add_argument("model", help="catalog name, https URL of a .gguf, or hf://owner/repo/file.gguf")
    p.add_argument("--sha256", default=None, help="expected sha256 of a URL download")
    p.add_argument("--name", default=None, help="store name for a URL download (default: file stem)")
    add_settings_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    store = ModelStore(settings.models_dir)
    path = store.pull(args.model, sha256=args.sha256, name=args.name)
    print(path)
    return 0
