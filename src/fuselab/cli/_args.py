"""Arguments shared by commands that take an op: OP, --impl, --dtype, --shape, --opt, --device."""

from __future__ import annotations

import argparse

import torch

from fuselab.ops.evaluate import parse_dtype
from fuselab.ops.registry import Op, get_op, parse_shape
from fuselab.ops.user import user_op


def add_op_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("op", help="a registered op (gelu, softmax) or a function as MODULE:FUNCTION / FILE.py:FUNCTION")
    p.add_argument("--impl", action="append", help="implementation(s), comma-separated or repeated (default: all)")
    p.add_argument("--dtype", action="append", help="float32, float16, bfloat16 (or fp32, fp16, bf16)")
    p.add_argument("--shape", action="append", help="shape(s) like 2^24 or 4096x1024, repeated (default: the op's)")
    p.add_argument("--opt", action="append", default=[], metavar="KEY=VALUE", help="op option, e.g. approximate=none")
    p.add_argument("--nargs", type=int, default=1, help="for MODULE:FUNCTION: how many input tensors it takes")
    p.add_argument("--device", default=None, help="cuda or cpu (default: the GPU if any)")


def split(values: list[str] | None) -> list[str] | None:
    if not values:
        return None
    return [v.strip() for value in values for v in value.split(",") if v.strip()]


def resolve(args: argparse.Namespace) -> tuple[Op, dict]:
    """The op and the keyword arguments for check_op/bench_op from parsed arguments."""
    op = user_op(args.op, args.nargs) if ":" in args.op else get_op(args.op)
    options = {}
    for item in args.opt:
        if "=" not in item:
            raise ValueError(f"--opt takes KEY=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        options[key.strip()] = value.strip()
    kwargs = {
        "impls": split(args.impl),
        "dtypes": [parse_dtype(d) for d in split(args.dtype) or []] or None,
        "shapes": [parse_shape(s) for s in args.shape] if args.shape else None,
        "options": op.resolve_options(options) if options else None,
        "device": args.device or ("cuda" if torch.cuda.is_available() else "cpu"),
    }
    return op, kwargs
