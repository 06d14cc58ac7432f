"""The command line: `fuselab <command> ...`. Thin: each command module parses, calls the library, prints.

A command module defines `register(subparsers)`, which adds its parser and sets `func(args) -> int` on it.
Arguments shared by commands (OP, --impl, --dtype, --shape, --opt, --device) are parsed once, in `_args`.

One error policy for every command: bad input and every expected failure (ValueError, TypeError, an unknown name,
an unavailable impl, a file that cannot be read or written, a module that cannot be imported) print one line,
`fuselab <command>: error: ...`, and exit 2; never a traceback. Anything else (a bug) prints one line too, and
exits 3. Set FUSELAB_DEBUG=1 to see the traceback. Exit codes: 0 done; 1 the run found failures (a check failed,
every case of a bench failed); 2 bad input or an expected error; 3 an unexpected error; 130 interrupted.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import warnings
from typing import NoReturn

import fuselab
from fuselab.bench import distributed

COMMANDS = ("list", "device", "check", "bench", "tune", "profile", "inspect", "report", "timers", "compare")
EXPECTED_ERRORS: tuple[type[BaseException], ...] = (ValueError, TypeError, LookupError, OSError, ImportError)


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors: `fuselab bench: error: argument --shape: bad shape '12xq' ...`."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> Parser:
    parser = Parser(prog="fuselab", description=fuselab.__doc__)
    parser.add_argument("--version", action="version", version=f"fuselab {fuselab.__version__}")
    parser.add_argument(  # taken out of argv by main(), anywhere in it; listed here for --help
        "--gpus", metavar="N|all", help="run the command on N GPUs of this host (torchrun, one process per GPU)"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"fuselab.cli.{name}").register(sub)
    return parser


def debug() -> bool:
    return os.environ.get("FUSELAB_DEBUG", "") not in ("", "0")


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings as one line each, `fuselab: warning: ...` (with FUSELAB_DEBUG, Python's own form)."""
    print(f"fuselab: warning: {message}", file=file or sys.stderr)


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
    if not debug():
        warnings.showwarning = _show_warning
    from fuselab.bench.sweep import NotRun  # after parsing: --help stays quick (Unavailable, TooBig: NotRun)

    try:
        with distributed.session():  # under torchrun: the process group, one GPU per rank
            return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted; finished results are kept", file=sys.stderr)
        return 130
    except (*EXPECTED_ERRORS, NotRun, distributed.LogBusy) as exc:
        if debug():
            raise
        who = f" (rank {distributed.rank()})" if distributed.active() else ""
        print(f"fuselab {args.command}{who}: error: {_message(exc)}", file=sys.stderr)
        return 2
    except Exception as exc:  # a bug: still one line, and how to see more
        if debug():
            raise
        print(
            f"fuselab {args.command}: error: {type(exc).__name__}: {_message(exc)} "
            "(unexpected: run with FUSELAB_DEBUG=1 for the traceback)",
            file=sys.stderr,
        )
        return 3


def _message(exc: BaseException) -> str:
    """The first line of the exception's message (its type's name when it has none)."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__
