"""`fuselab timers`: the harness against other timers (`crosscheck`) and under each timer's conditions (`conditions`).

fuselab timers crosscheck --out harness.json           (fuselab vs triton do_bench vs torch.profiler)
fuselab timers conditions --out timer_conditions.json  (the bf16 matmul under each timer's conditions, SM clock)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fuselab.cli._args import add_device_argument, check_writable, default_device, positive


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "timers",
        help="fuselab's timer against do_bench and torch.profiler, and under each timer's conditions",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("study", choices=("crosscheck", "conditions"), help="which study")
    add_device_argument(p)
    p.add_argument("--rounds", type=positive(int), default=3, help="the timers take turns this many times (default 3)")
    p.add_argument("--rep-ms", type=positive(float), help="each timer's repetitions per round, ms (default 333 / 300)")
    p.add_argument("--quick", action="store_true", help="small sizes (a look, not a measurement)")
    p.add_argument("--out", type=Path, help="also write the result as JSON here")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from fuselab.studies.timers import crosscheck, timer_conditions

    check_writable(args.out)
    device = args.device or default_device()
    if args.study == "crosscheck":
        result = crosscheck(device, rounds=args.rounds, rep_ms=args.rep_ms or 1000 / 3, quick=args.quick)
    else:
        result = timer_conditions(device, rounds=args.rounds, rep_ms=args.rep_ms or 300.0, quick=args.quick)
    print(result.text())
    if args.out:
        args.out.write_text(json.dumps(result.to_json(), indent=1) + "\n")
        print(f"wrote {args.out}")
    return 1 if args.study == "crosscheck" and result.disagreements else 0
