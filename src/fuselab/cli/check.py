"""`fuselab check OP`: every available impl against the float64 reference; exit 1 when any fails."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console

from fuselab.bench import distributed
from fuselab.bench.results import fmt_float, fmt_plain, make_table
from fuselab.cli._args import add_op_arguments, resolve
from fuselab.ops.evaluate import check_op, summarize_checks


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("check", help="check every implementation of an op against its float64 reference")
    add_op_arguments(p)
    p.add_argument("--seed", type=int, help="seed for the random inputs (default: fresh each run)")
    p.add_argument("--out", type=Path, help="write the rows as JSON")
    p.add_argument("--all", action="store_true", help="list every case, not one row per impl and dtype")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    op, kwargs = resolve(args)
    rows = check_op(op, seed=args.seed, **kwargs)
    if not distributed.is_main():  # under torchrun, rank 0 prints and writes for all
        return 1 if any(r["status"] == "FAIL" for r in rows) else 0
    console = Console()
    available = [r for r in rows if r["status"] != "unavailable"]
    shown = available if args.all else summarize_checks(available)
    columns = [
        ("impl", "impl", fmt_plain),
        ("dtype", "dtype", fmt_plain),
        *[(k, k, fmt_plain) for k in op.options],
        ("cases", "cases", fmt_plain),
        ("rel_err", "max rel err", fmt_float(2)),
        ("grad_rel_err", "max grad rel err", fmt_float(2)),
        ("tolerance", "tolerance", fmt_float(2)),
        ("status", "status", fmt_plain),
    ]
    if any(r["status"] == "FAIL" for r in rows):
        columns.append(("reason", "reason", fmt_plain))
    if args.all:
        columns.insert(2, ("shape", "shape", fmt_plain))
    console.print(make_table(shown, columns, title=f"check {op.name} on {rows[0]['device'] if rows else '-'}"))
    unavailable: dict[tuple[str, str], list[str]] = {}
    for r in rows:
        if r["status"] == "unavailable":
            dtypes = unavailable.setdefault((r["impl"], r["reason"]), [])
            dtypes += [] if r["dtype"] in dtypes else [r["dtype"]]
    for (impl, reason), dtypes in unavailable.items():
        console.print(f"[yellow]{impl}[/yellow] ({', '.join(dtypes)}) not checked: {reason}")
    failed = [r for r in rows if r["status"] == "FAIL"]
    passed = sum(r["status"] == "pass" for r in rows)
    console.print(f"{passed} passed, {len(failed)} failed, {len(rows) - passed - len(failed)} unavailable")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(rows, indent=1, default=str) + "\n")
    return 1 if failed else 0
