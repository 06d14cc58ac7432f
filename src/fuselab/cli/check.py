"""`fuselab check OP`: every available impl against the float64 reference.

Exit status: 1 when any case of fuselab's impls fails, or when nothing could be checked on a device the user asked
for (--device); 2 on bad input. A failure of PyTorch's own impls (`Impl.upstream`: torch, compile, the SDPA backends)
is shown and counted apart, as the GPU gate counts it (docs/gate.md).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from fuselab.bench import distributed
from fuselab.bench.dtypes import short_name
from fuselab.bench.env import provenance
from fuselab.bench.record import Verdict
from fuselab.bench.results import fmt_float, fmt_plain, make_table, print_table, write_json
from fuselab.bench.shapes import LAYOUTS
from fuselab.bench.sweep import TooBig
from fuselab.cli._args import add_op_arguments, check_writable, resolve
from fuselab.evaluate import check_op, summarize_checks


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("check", help="check every implementation of an op against its float64 reference")
    add_op_arguments(p, check=True)
    p.add_argument("--seed", type=int, help="seed for the random inputs (default: fresh each run)")
    p.add_argument("--out", type=Path, help="write the rows as JSON ({meta: {env}, records: [...]}, as bench's)")
    p.add_argument("--all", action="store_true", help="list every case, not one row per impl and dtype")
    p.add_argument(
        "--layout", choices=LAYOUTS, action="append", help="inputs' memory layout (default contiguous); may repeat"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    op, selection = resolve(args)
    check_writable(args.out)
    rows = check_op(op, selection, seed=args.seed, refuse_early=True)
    failed = [r for r in rows if r.status is Verdict.FAIL and not op.get_impl(r.case.impl).upstream]
    if not distributed.is_main():  # under torchrun, rank 0 prints and writes for all
        return 1 if failed else 0
    console = Console(highlight=False)
    refused = [r for r in rows if r.status is Verdict.REFUSED]
    if refused and not any(r.status.ran for r in rows):
        raise TooBig(f"no case could be checked; refused before allocating: {refused[0].reason}")
    available = [r for r in rows if r.status.ran]
    shown = available if args.all else summarize_checks(available)
    columns = [
        ("impl", "impl", fmt_plain),
        ("dtype", "dtype", short_name),
        *([("layout", "layout", fmt_plain)] if len(selection.layouts) > 1 else []),
        *[(k, k, fmt_plain) for k in op.options],
        ("cases", "cases", fmt_plain),
        ("rel_err", "max rel err", fmt_float(2)),
        ("grad_rel_err", "max grad rel err", fmt_float(2)),
        ("tolerance", "tolerance", fmt_float(2)),
        ("status", "status", fmt_plain),
    ]
    if any(r.status is Verdict.FAIL for r in rows):
        columns.append(("reason", "reason", fmt_plain))
    if args.all:
        columns.insert(2, ("shape", "shape", fmt_plain))
    print_table(make_table(shown, columns, title=f"check {op.name} on {selection.device}"), console)
    unavailable: dict[tuple[str, str], list[str]] = {}
    for r in rows:
        if not r.status.ran:
            dtypes = unavailable.setdefault((r.case.impl, str(r.reason)), [])
            dtypes += [] if short_name(r.case.dtype) in dtypes else [short_name(r.case.dtype)]
    for (impl, reason), dtypes in unavailable.items():
        console.print(f"[yellow]{impl}[/yellow] ({', '.join(dtypes)}) not checked: {reason}")
    upstream = sum(r.status is Verdict.FAIL for r in rows) - len(failed)
    passed = sum(r.status is Verdict.PASS for r in rows)
    theirs = f", {upstream} failed in PyTorch's own impls (not counted)" if upstream else ""
    console.print(
        f"{passed} passed, {len(failed)} failed{theirs}, {len(rows) - passed - len(failed) - upstream} unavailable"
    )
    if args.out:
        write_json(rows, args.out, meta={"env": provenance(selection.device)})
    if failed:
        return 1
    if not passed and not upstream and args.device:
        console.print(f"[red]nothing could be checked on {args.device}[/red]")
        return 1
    return 0
