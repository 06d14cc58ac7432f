"""The command line: `fuselab <command> ...`. Thin: each command module parses, calls the library, prints.

A command module defines `register(subparsers)`, which adds its parser and sets `func(args) -> int` on it.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

import fuselab
from fuselab.bench import distributed

COMMANDS = ("device", "check", "bench", "profile", "inspect", "report")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fuselab", description=fuselab.__doc__)
    parser.add_argument(  # taken out of argv by main(), anywhere in it; listed here for --help
        "--gpus", metavar="N|all", help="run the command on N GPUs of this host (torchrun, one process per GPU)"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"fuselab.cli.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv, gpus = distributed.pop_gpus(sys.argv[1:] if argv is None else argv)
    if gpus is not None and "WORLD_SIZE" not in os.environ:  # --gpus N: run this command under torchrun
        try:
            n = distributed.gpus_requested(gpus)
        except ValueError as exc:
            print(f"fuselab: error: {exc}", file=sys.stderr)
            return 2
        if n > 1:
            return distributed.launch(argv, n)
    args = build_parser().parse_args(argv)
    try:
        with distributed.session():  # under torchrun: the process group, one GPU per rank
            return int(args.func(args) or 0)
    except (ValueError, LookupError, FileNotFoundError, ImportError, distributed.LogBusy) as exc:
        who = f" (rank {distributed.rank()})" if distributed.active() else ""
        print(f"fuselab {args.command}{who}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; finished results are kept", file=sys.stderr)
        return 130
