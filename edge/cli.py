"""The `edge` command: a thin dispatcher over `edge/commands/*`.

Each command module defines `register(subparsers)`, which adds its parser and
sets `func=run`; `run(args) -> int` returns the exit status. Deliberate errors
(`EdgeError`) print one line and exit 1; nothing prints a stack trace unless
`EDGE_DEBUG=1`.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from edge import __version__
from edge.errors import EdgeError

# Order here is the order in `edge --help`.
COMMAND_MODULES: tuple[str, ...] = (
    "serve", "run", "chat", "status", "service",
    "pull",
    "ls",
    "rm",
    "inspect",
    "plan",
    "doctor",
    "bench",
    "eval", "quantize",
    "report",
    "history",
    "sim",
)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line, or only the `only` command's part: each command module imports what
    its command needs, so `edge serve` starts sooner without the other fifteen."""
    parser = argparse.ArgumentParser(
        prog="edge",
        description="On-device LLM inference runtime for Jetson, Apple Silicon and CPUs.",
    )
    parser.add_argument("--version", action="version", version=f"edge {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log more")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES if only not in COMMAND_MODULES else (only,):
        importlib.import_module(f"edge.commands.{name}").register(sub)
    return parser


def command_named(argv: list[str]) -> str | None:
    """The command word of `argv` (the first argument that is not an option), if it is one."""
    word = next((a for a in argv if not a.startswith("-")), None)
    return word if word in COMMAND_MODULES else None


def _gguf_checked(path: str) -> None:
    """edge's GGUF checks (cached per file), which the host runs before any load: the early thread
    runs them first on a file no start has loaded (runtime/llama/early.py)."""
    from edge.gguf.validate import validated

    validated(path)


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    command = command_named(words)
    if command == "serve" and argv is None:  # a process of its own: the weights may start loading now
        from edge.gcpause import START
        from edge.runtime.llama.early import EARLY

        START.pause()  # settled by serve once the load is done and the first requests ran
        EARLY.begin(words, check=_gguf_checked)
    parser = build_parser(command)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    from edge.commands.exits import EXIT_INTERRUPTED, EXIT_USAGE, exit_status

    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        return int(args.func(args) or 0)
    except EdgeError as exc:
        if os.environ.get("EDGE_DEBUG"):
            raise
        print(f"edge: error: {exc}", file=sys.stderr)
        return exit_status(exc)
    except KeyboardInterrupt:
        print("edge: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
