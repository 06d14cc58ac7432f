"""`fuselab report`: run the lecture end to end on this device; write report.md, report.html, plots and JSON."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from rich.console import Console

from fuselab.bench import distributed
from fuselab.cli._args import add_device_argument, check_writable
from fuselab.report import run_full_report
from fuselab.report.sections import section_names


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="run the whole lecture on this device and write a Markdown + HTML report")
    p.add_argument("--out", type=Path, default=Path("report"), help="output folder (default: report/)")
    p.add_argument("--quick", action="store_true", help="tiny sizes: a look at every section in a minute or two")
    p.add_argument("--fresh", action="store_true", help="rerun sections already finished in --out (default: resume)")
    add_device_argument(p)
    p.add_argument(
        "--only",
        action="append",
        metavar="SECTION",
        help=f"run only these sections, comma-separated or repeated: {', '.join(section_names())}",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    check_writable(args.out, folder=True)
    only = [s.strip() for value in args.only or [] for s in value.split(",") if s.strip()] or None
    console = Console()
    start = time.perf_counter()
    records = run_full_report(
        args.out, device=args.device, quick=args.quick, fresh=args.fresh, only=only, console=console
    )
    if not distributed.is_main():  # under torchrun, rank 0 writes and tells
        return 0
    failed = [r["title"] for r in records.values() if r.get("status") == "failed"]
    console.print(
        f"wrote {args.out / 'report.md'} and {args.out / 'report.html'} in {time.perf_counter() - start:.0f} s"
    )
    if failed:
        console.print(f"[yellow]{len(failed)} section(s) failed (shown in the report): {', '.join(failed)}[/yellow]")
        return 1
    return 0
