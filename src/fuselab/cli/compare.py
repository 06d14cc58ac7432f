"""`fuselab compare ONE.json MANY.json`: a sweep run on 1 GPU against the same sweep on N GPUs (`--gpus N`).

    fuselab compare r/sweep_1gpu.json r/sweep_2gpu.json --walls one=83.1,one_resume=9.0,many=47.2,many_resume=14.0

Exit 1 when a case is missing from a log or measured more than once.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fuselab.cli._args import check_writable, positive


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compare",
        help="a sweep on 1 GPU against the same sweep on N: every case once, the winners, the speed-ups",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("one", type=Path, help="X.json of the 1-GPU `fuselab bench` run (its log X.jsonl is read)")
    p.add_argument("many", type=Path, help="X.json of the N-GPU run")
    p.add_argument("--walls", default="", help="NAME=SECONDS,... with NAME one, one_resume, many, many_resume")
    p.add_argument("--close", type=positive(float), default=0.02, help="runner-up within this fraction: a close call")
    p.add_argument("--out", type=Path, help="also write the comparison as JSON here")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from fuselab.bench.compare import Walls, compare_runs, load_log

    check_writable(args.out)
    walls = Walls.parse(args.walls)
    result = compare_runs(load_log(args.one), load_log(args.many), walls, args.close)
    print(result.text())
    if args.out:
        args.out.write_text(json.dumps(result.to_json(), indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0 if result.every_case_once else 1
