"""The ``batchserve`` command line: a thin skin over the Python API.

Each subcommand lives in its own module with ``add_parser(subparsers)`` (which registers it
and sets ``run``, a function from the parsed arguments to an exit status). On failure the
CLI prints ``ErrorName: message`` to stderr and exits non-zero.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

__all__ = ["main"]

# Subcommand modules, in the order ``--help`` lists them.
COMMANDS = ("demo", "serve", "simulate", "profile", "load", "tune", "top")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand registered."""
    parser = argparse.ArgumentParser(
        prog="batchserve", description="A Python model server built around dynamic batching."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        importlib.import_module(f"batchserve.cli.{name}").add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        status: int = args.run(args)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return status
