"""CLI subcommands: each module defines `register(subparsers)` and sets `func=run`."""
