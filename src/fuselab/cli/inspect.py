"""`fuselab inspect OP --impl triton|cuda`: PTX, SASS, registers, shared memory, spills, and a short summary
(the widest global load and store: were loads vectorized?).

    fuselab inspect gelu --impl triton --dtype float32 --out inspect/gelu-triton
    fuselab inspect softmax --impl triton,cuda --dtype bfloat16 --out inspect   (inspect/softmax-triton-bfloat16, ...)
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import torch
from rich.console import Console

from fuselab.bench.dtypes import dtype_name
from fuselab.cli._args import add_impl_argument, check_writable, dtype_arg, op_names, shape_arg, split


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "inspect",
        help="PTX/SASS, registers, shared memory and spills of a Triton or CUDA implementation",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("op", help=op_names())
    add_impl_argument(p, default="triton")
    p.add_argument("--dtype", type=dtype_arg, default=torch.float32, help="fp32, fp16, bf16 (default fp32)")
    p.add_argument("--shape", type=shape_arg, help="shape the Triton kernels are specialized for (default: the op's)")
    p.add_argument("--arch", help="target, e.g. sm_90 (default: this GPU's, or sm_90 without one)")
    p.add_argument("--out", type=Path, help="folder for the .ptx/.sass files, inspect.json, summary.txt")
    p.add_argument("--show", choices=("ptx", "sass"), help="also print the PTX or SASS of each kernel")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from fuselab.profile.inspect import inspect_impl

    check_writable(args.out, folder=True)
    console = Console(highlight=False)
    impls = split(args.impl) or ["triton"]
    status = 0
    for impl in impls:
        label = re.sub(r"[^\w.-]+", "_", f"{args.op}-{impl}-{dtype_name(args.dtype)}")
        try:
            result = inspect_impl(args.op, impl, dtype=args.dtype, shape=args.shape, arch=args.arch)
        except (ValueError, LookupError, ImportError, RuntimeError) as exc:
            print(f"fuselab inspect: error: {label}: {exc}", file=sys.stderr)  # the CLI's one error style
            status = 2
            continue
        if args.show:
            for k in result.kernels:
                console.print(f"[bold]{k.name}[/bold]")
                print((k.ptx if args.show == "ptx" else k.sass) or f"(no {args.show.upper()})")
        print(result.summary())
        base = args.out or Path("fuselab-inspect")
        out = base / label if len(impls) > 1 or args.out is None else base
        files = result.write(out)
        console.print(f"wrote {len(files)} files to {out}")
        status = max(status, 0 if result.kernels else 1)
    return status
