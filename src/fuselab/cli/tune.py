"""`fuselab tune OP`: time an op's candidate plan parameters on this GPU and write its plan table (the op's folder,
plans/<device key>.json), which its launchers load. The op supplies a `tune` module in its folder with
run(shapes, dtypes, device, quick, compile_peer) -> (parameters, evidence)."""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

import torch

from fuselab.bench.shapes import draw_shapes, parse_random
from fuselab.cli._args import split
from fuselab.ops import tuning
from fuselab.ops.evaluate import parse_dtype
from fuselab.ops.registry import get_op, parse_shape


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tune", help="tune an op's launch rules on this GPU; writes its plan table")
    p.add_argument("op", help="a registered op with a tune module (gelu, softmax)")
    p.add_argument("--dtype", action="append", help="dtypes to tune on (default fp32 and bf16)")
    p.add_argument("--shape", action="append", help="shapes to tune on (repeatable)")
    p.add_argument("--shapes", default="random:12", metavar="random:N", help="else N random shapes (default 12)")
    p.add_argument("--seed", type=int, default=1, help="seed of the random draw (check on another seed)")
    p.add_argument("--quick", action="store_true", help="fewer repetitions")
    p.add_argument("--no-compile", action="store_true", help="do not time torch.compile beside (faster)")
    p.add_argument("--dry-run", action="store_true", help="print the table instead of writing it")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    op = get_op(args.op)
    try:
        tuner = importlib.import_module(f"fuselab.ops.{op.name}.tune")
    except ModuleNotFoundError:
        raise ValueError(f"op {op.name!r} has no tuner (a tune module in its folder)") from None
    if not callable(getattr(tuner, "run", None)):
        raise ValueError(
            f"op {op.name!r}: its tuner has no run(shapes, dtypes, device, quick, compile_peer) for fuselab tune; "
            f"run it as python -m {tuner.__name__}"
        )
    if not torch.cuda.is_available():
        raise ValueError("fuselab tune times plans on a CUDA GPU; none is visible here")
    device = torch.device("cuda", torch.cuda.current_device())
    dtypes = [parse_dtype(d) for d in split(args.dtype) or ["fp32", "bf16"]]
    if args.shape:
        shapes = [parse_shape(s) for s in args.shape]
    else:
        n = parse_random(args.shapes)
        if n is None or op.random_shape is None:
            raise ValueError("give --shape, or --shapes random:N for an op with a random_shape")
        shapes = draw_shapes(op.random_shape, n, args.seed)
    params, evidence = tuner.run(shapes, dtypes, device, args.quick, not args.no_compile)
    key = tuning.device_key(device.index)
    folder = Path(tuner.__file__).parent
    print(f"winner: {evidence['winner']}; scores (geomean time / best): "
          + ", ".join(f"{k} {v:.3f}" for k, v in sorted(evidence["scores"].items(), key=lambda kv: kv[1])))  # fmt: skip
    if args.dry_run:
        print({"device": key, "params": params})
    else:
        print(f"wrote {tuning.write_table(folder, key, params, evidence)}")
    return 0
