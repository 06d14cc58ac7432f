"""The command line: `fuselab <command> ...`. Thin: each command module parses, calls the library, prints.

A command module defines `register(subparsers)`, which adds its parser and sets `func(args) -> int` on it.
"""

from __future__ import annotations

import argparse
import importlib
import sys

import fuselab

COMMANDS = ("device", "check", "bench", "tune", "profile", "inspect", "report")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fuselab", description=fuselab.__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"fuselab.cli.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, LookupError, FileNotFoundError, ImportError) as exc:
        print(f"fuselab {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; finished results are kept", file=sys.stderr)
        return 130
