"""`fuselab tune OP`: time an op's candidate plan parameters on this GPU and write its plan table (the op's folder,
plans/<device key>.json), which its launchers load. The op names a tuner (its Op's `tuner` module: cases, measure,
choose; see fuselab.ops.tuning); a tuner may also be given as FILE.py or MODULE:NAME.

Under torchrun (`torchrun --nproc-per-node N -m fuselab tune OP`, or `fuselab --gpus N tune OP`) the cases are split
over the ranks by estimated cost, each rank times its share on its own GPU, and rank 0 gathers every measurement,
chooses as one GPU would and writes the one table; the other ranks print only their progress."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fuselab.bench import distributed
from fuselab.bench.dtypes import parse_dtype
from fuselab.bench.shapes import draw_shapes, parse_random
from fuselab.cli._args import op_names, split
from fuselab.ops import tuning
from fuselab.ops.registry import Shape, get_op, parse_shape


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tune", help="tune an op's launch rules on this GPU (or torchrun's); writes its plan table")
    p.add_argument("op", help=f"{op_names(tuned=True)}, or a tuner as FILE.py or MODULE:NAME")
    p.add_argument("--dtype", action="append", help="dtypes to tune on (default: the tuner's, else fp32 and bf16)")
    p.add_argument("--shape", action="append", help="shapes to tune on (repeatable; attention: the last dim is d)")
    p.add_argument(
        "--shapes", metavar="random:N", help="else N random shapes (default: the tuner's shapes, else random:12)"
    )
    p.add_argument("--seed", type=int, default=1, help="seed of the random draw (check on another seed)")
    p.add_argument(
        "--check", metavar="random:N|SHAPE,...",
        help="held-out shapes (a draw of --check-seed, or a list): the chosen candidates are timed there too, and any "
        "that slows one of them down is dropped",
    )  # fmt: skip
    p.add_argument("--check-seed", type=int, help="seed of the held-out draw (default: --seed + 1)")
    p.add_argument(
        "--part", action="append", help="tune only these parts of its plans (attention: fwd, dkdv, dq, short, long)"
    )
    p.add_argument("--quick", action="store_true", help="fewer repetitions")
    p.add_argument("--no-compile", action="store_true", help="do not time torch.compile beside (faster)")
    p.add_argument("--dry-run", action="store_true", help="print the table instead of writing it")
    p.add_argument(
        "--journal", type=Path, metavar="FILE.jsonl", help="each case's measurement, appended; what it holds is kept"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.journal and args.journal.suffix != ".jsonl":
        raise ValueError(f"--journal {args.journal}: give FILE.jsonl")
    tuner = tuning.load_tuner(args.op)
    device = tuning.tuner_device(tuner)
    dtypes = [parse_dtype(d) for d in split(args.dtype) or getattr(tuner, "default_dtypes", ("fp32", "bf16"))]
    parts = split(args.part)
    if parts and not getattr(tuner, "parts", None):
        raise ValueError(f"the tuner of {args.op} has no parts to choose from (--part)")
    extra = {"parts": parts} if parts else {}
    cases = distributed.broadcast(tuner.cases(_shapes(args, tuner), dtypes, **extra))  # rank 0's, on every rank
    if not cases:
        raise ValueError(f"the tuner of {args.op} made no cases of these shapes and dtypes")
    check_cases: list = []
    if args.check:
        if not tuning.checks_held_out(tuner):
            raise ValueError(f"the tuner of {args.op} cannot check its choice on held-out shapes (--check)")
        seed = args.seed + 1 if args.check_seed is None else args.check_seed
        held_out = _check_shapes(args.check, seed, args, tuner)
        check_cases = distributed.broadcast(tuner.cases(held_out, dtypes, **extra))
    spread = f", spread over {distributed.world_size()} ranks" if distributed.active() else ""
    if distributed.is_main():
        print(f"tuning {args.op}: {len(cases)} case(s) on {device}{spread}", flush=True)
    tuned = tuning.tune(
        tuner, cases, device, args.quick, not args.no_compile, log=lambda line: print(line, flush=True),
        journal=args.journal, check_cases=check_cases,
    )  # fmt: skip
    if tuned is None:  # not rank 0: it measured its share; rank 0 chooses and writes
        return 0
    if tuned.failed:  # each was logged where it failed; the count (and, from other ranks, which) here
        held_out = sum(1 for failure in tuned.failed if failure.get("held_out"))
        also = f" and {held_out} of {len(check_cases)} held-out" if held_out else ""
        print(f"{len(tuned.failed) - held_out} of {len(cases)}{also} case(s) failed to measure", file=sys.stderr)
        for failure in tuned.failed if distributed.active() else ():
            label = tuning.describe(tuner, failure["case"])
            print(f"  {label} (rank {failure['rank']}): {failure['error']}", file=sys.stderr)
    if not tuned.params and not tuned.evidence:
        print(f"fuselab tune: every case failed ({len(cases)}); no table written", file=sys.stderr)
        return 1
    evidence = tuned.evidence
    checked = evidence.get("checked", {})
    for name, worst in checked.get("slowest", {}).items():
        where = tuning.describe(tuner, worst["case"]) if worst["case"] else "no held-out launch changed"
        verdict = "dropped" if name in checked["dropped"] else "kept"
        print(f"held out: {name}: at most {worst['ratio']:.3f}x the rules as they stand ({where}): {verdict}")
    if "winner" in evidence:
        scores = sorted(evidence.get("scores", {}).items(), key=lambda kv: kv[1])
        print(f"winner: {evidence['winner']}; scores (geomean time / best): "
              + ", ".join(f"{k} {v:.3f}" for k, v in scores))  # fmt: skip
    else:
        for key, value in tuned.params.items():
            print(f"{key}: {value}")
    key = tuning.table_key(tuner, device)
    if args.dry_run:
        print({"device": key, "params": tuned.params})
    else:
        print(f"wrote {tuning.write(tuner, tuned.params, evidence, device)}")
    return 1 if tuned.failed else 0


def _shapes(args: argparse.Namespace, tuner: object) -> list[Shape]:
    """--shape as given; else the tuner's default shapes unless --shapes asks for a draw; else random:N of the op's
    (or the tuner's) random_shape."""
    if args.shape:
        return [parse_shape(s) for s in args.shape]
    if args.shapes is None and getattr(tuner, "default_shapes", None):
        return [tuple(s) for s in tuner.default_shapes]
    n = parse_random(args.shapes or "random:12")
    random_shape = getattr(tuner, "random_shape", None)
    if random_shape is None and not (args.op.endswith(".py") or ":" in args.op):
        random_shape = get_op(args.op).defaults.random_shape
    if n is None or random_shape is None:
        raise ValueError("give --shape, or --shapes random:N for an op with a random_shape")
    return draw_shapes(random_shape, n, args.seed)


def _check_shapes(spec: str, seed: int, args: argparse.Namespace, tuner: object) -> list[Shape]:
    """--check: "random:N" (a draw of `seed`, as --shapes draws) or shapes separated by commas."""
    if spec.startswith("random:"):
        return _shapes(argparse.Namespace(**{**vars(args), "shape": None, "shapes": spec, "seed": seed}), tuner)
    return [parse_shape(s) for s in spec.split(",") if s.strip()]
