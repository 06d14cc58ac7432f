"""`fuselab profile`: the kernel table, trace and timeline of an op's impl, a lecture case, a function or a script;
`fuselab profile --runahead`: the CPU-runs-ahead-of-the-GPU study.

    fuselab profile gelu --impl triton --shape 2^24 --dtype float32
    fuselab profile --case matmul2048 --out prof/matmul2048
    fuselab profile --case all --out prof                  (prof/add, prof/matmul2048, ...)
    fuselab profile softmax --impl all --shape 4096x4096    (a folder per impl; unavailable ones say why)
    fuselab profile mymod:fn --shape 4096x4096 --nargs 2
    fuselab profile --script train.py
    fuselab profile gelu --impl all --counters              (Nsight Compute: DRAM bytes vs the cost model, verdicts)
    fuselab profile attention --impl triton,sdpa-cudnn --shape 16x1x16384x64 --dtype bf16 --opt causal=true \
        --backward --counters                               (forward + backward: every kernel's counters)
    fuselab profile --runahead --steps 20 --layers 4 --dim 2048 --batch 2048 --out prof/runahead
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from rich.console import Console

from fuselab.bench.env import provenance
from fuselab.bench.sweep import Unavailable
from fuselab.cli._args import (
    add_device_argument,
    add_opt_argument,
    check_writable,
    default_device,
    dtype_arg,
    load_op,
    op_names,
    parse_options,
    positive,
    shape_arg,
    split,
)
from fuselab.profile import build_table, impl_callable, profile_callable, render_timeline, script_callable
from fuselab.profile.cases import CASES, get_case
from fuselab.profile.table import SORT_KEYS

if TYPE_CHECKING:
    from fuselab.ops.registry import Op


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "profile",
        help="profile an op's impl, a lecture case, a function or a script: kernel table, trace, timeline",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("target", nargs="?", help=f"{op_names()} or MODULE:FUNCTION / FILE.py:FUNCTION")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--case", choices=[*CASES, "all"], help="one of the lecture's cases, or all of them")
    what.add_argument("--script", type=Path, help="a Python script, run as __main__")
    what.add_argument("--runahead", action="store_true", help="the run-ahead study (MLP training loop, twice)")
    p.add_argument("--impl", action="append", help="implementation(s), comma-separated, or all (default: the baseline)")
    p.add_argument("--shape", type=shape_arg, help="input shape, e.g. 2^24 or 4096x1024 (default: the op's)")
    p.add_argument("--dtype", type=dtype_arg, default=torch.float32, help="fp32, fp16, bf16 (default fp32)")
    p.add_argument(
        "--backward", action="store_true", help="an op's forward + backward (autograd.grad of its inputs), not forward"
    )
    add_opt_argument(p)
    p.add_argument("--nargs", type=positive(int), default=1, help="for MODULE:FUNCTION: how many tensors it takes")
    add_device_argument(p)
    p.add_argument("--warmup", type=int, default=3, help="calls before profiling (default 3; 1 for --script)")
    p.add_argument("--iters", type=positive(int), default=5, help="calls profiled (default 5; 1 for --script)")
    p.add_argument("--sort", choices=SORT_KEYS, help="sort rows by (default: gpu with a GPU, else cpu)")
    p.add_argument("--limit", type=int, default=25, help="operators shown in the terminal (default 25)")
    p.add_argument("--full-names", action="store_true", help="show kernels' full names")
    p.add_argument("--stacks", action="store_true", help="also write collapsed stacks for flame graphs")
    p.add_argument(
        "--out", type=Path, help="folder for trace.json, table.json, table.txt, timeline.png (one per label if several)"
    )
    counters = p.add_argument_group("hardware counters (Nsight Compute)")
    counters.add_argument(
        "--counters", action="store_true", help="run the op's impl(s) under ncu: DRAM bytes vs the cost model, verdicts"
    )
    counters.add_argument("--kernel", metavar="REGEX", help="with --counters: only kernels whose name matches")
    study = p.add_argument_group("run-ahead study")
    study.add_argument("--steps", type=int, default=20, help="training steps (default 20)")
    study.add_argument("--layers", type=int, default=4, help="Linear layers (default 4)")
    study.add_argument("--dim", type=int, help="width (default 2048 on a GPU, 128 on the CPU)")
    study.add_argument("--batch", type=int, help="batch size (default 2048 on a GPU, 128 on the CPU)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    check_writable(args.out, folder=True)
    return _run(args, Console())


Job = tuple[str, Callable[[], Callable[[], object]]]  # (label, make the callable to profile)


def _run(args: argparse.Namespace, console: Console) -> int:
    if args.backward and (not args.target or args.case or args.script or args.runahead):
        raise ValueError("--backward profiles an op's forward + backward: fuselab profile OP --backward")
    if args.runahead:
        return _runahead(args, console)
    if args.counters:
        return _counters(args, console)
    device = args.device or default_device()
    warmup, iters = args.warmup, args.iters
    if args.case:
        names = list(CASES) if args.case == "all" else [args.case]
        jobs: list[Job] = [(n, lambda n=n: get_case(n).make(device)) for n in names]
    elif args.script:
        jobs = [(args.script.stem, lambda: script_callable(args.script))]
        warmup = 1 if args.warmup == 3 else args.warmup
        iters = 1 if args.iters == 5 else args.iters
    elif args.target:
        jobs = _op_jobs(args, device)
    else:
        raise ValueError("say what to profile: an OP (or MODULE:FUNCTION), --case, --script or --runahead")
    failed = 0
    for label, make in jobs:
        base = args.out or Path("fuselab-profile")
        out = base / label if len(jobs) > 1 or args.out is None else base
        try:
            fn = make()
        except Unavailable as exc:  # an impl that cannot run here says why; the other jobs go on
            console.print(f"[yellow]{label}: skipped: {exc}[/yellow]", highlight=False)
            failed += 1
            continue
        _profile_one(args, console, label, fn, device, warmup, iters, out)
        del fn
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return 1 if failed == len(jobs) else 0


def _profile_one(
    args: argparse.Namespace,
    console: Console,
    label: str,
    fn: Callable[[], object],
    device: str,
    warmup: int,
    iters: int,
    out: Path,
) -> None:
    cuda = torch.device(device).type == "cuda"
    result = profile_callable(fn, label=label, warmup=warmup, iters=iters, out_dir=out, stacks=args.stacks, cuda=cuda)
    table = build_table(result.trace, title=f"{label} on {device}: {iters} call(s) profiled").sorted(args.sort)
    console.print(table.rich(limit=args.limit, full_names=args.full_names))
    if table.ranges:
        console.print(table.rich_ranges(limit=args.limit))
    (out / "table.json").write_text(json.dumps({**table.to_json(), "env": provenance(device)}, indent=1) + "\n")
    (out / "table.txt").write_text(table.to_text(full_names=args.full_names))
    timeline = render_timeline(result.trace, out / "timeline.png", title=f"{label} on {device}")
    files = [result.trace_path, out / "table.json", out / "table.txt", timeline, *result.stacks_paths]
    console.print("wrote " + ", ".join(str(f) for f in files), soft_wrap=True, highlight=False)
    console.print(f"open {result.trace_path} in https://ui.perfetto.dev for the full trace", soft_wrap=True)


def _impls(args: argparse.Namespace, op: Op) -> list[str]:
    """--impl as names (comma-separated or repeated; 'all': every impl; none: the op's baseline), each checked."""
    impls = split(args.impl) or [op.defaults.baseline]
    impls = list(op.impls) if impls == ["all"] else impls
    for impl in impls:
        op.get_impl(impl)  # unknown names fail here, with the known ones listed
    return impls


def _op_jobs(args: argparse.Namespace, device: str) -> list[Job]:
    """One job per requested impl (comma-separated, or 'all') of the op or user function."""
    from fuselab.bench.dtypes import dtype_name
    from fuselab.bench.shapes import format_shape

    op = load_op(args.target, args.nargs)
    impls = _impls(args, op)
    shape = args.shape or op.default_profile_shape()
    dtype = args.dtype
    options = parse_options(op, args.opt) or {}
    name = re.sub(r"[^\w.-]+", "_", op.name.rsplit(":", 1)[-1])

    def label(impl: str) -> str:
        parts = [name] if impl == name else [name, impl]
        return "-".join([*parts, format_shape(shape), dtype_name(dtype), *(["backward"] if args.backward else [])])

    def make(impl: str) -> Callable[[], object]:
        return impl_callable(op, impl, shape, dtype, device, options, backward=args.backward)

    return [(label(i), lambda i=i: make(i)) for i in impls]


def _counters(args: argparse.Namespace, console: Console) -> int:
    """`--counters`: the op's impls under ncu, one verdict per kernel; one line and status 1 where ncu cannot run."""
    from fuselab.bench.dtypes import dtype_name
    from fuselab.bench.shapes import format_shape
    from fuselab.bench.sweep import Unavailable
    from fuselab.ops.registry import get_op
    from fuselab.profile.counters import CountersUnavailable, counters_unavailable, profile_counters

    if not args.target or ":" in args.target or args.case or args.script:
        raise ValueError("--counters profiles a registered op: fuselab profile OP --counters [--impl ...]")
    reason = counters_unavailable(args.device or default_device())
    if reason:
        raise Unavailable(f"--counters: {reason}")  # one line, `fuselab profile: error: ...`, exit 2
    op = get_op(args.target)
    impls = _impls(args, op)
    shape = args.shape or op.default_profile_shape()
    options = parse_options(op, args.opt) or {}
    dtype = dtype_name(args.dtype)
    passes = "-backward" if args.backward else ""
    out = args.out or Path("fuselab-profile") / f"{op.name}-counters-{format_shape(shape)}-{dtype}{passes}"
    try:
        result = profile_counters(
            op,
            impls,
            shape,
            args.dtype,
            options,
            out_dir=out,
            warmup=args.warmup,
            iters=1,
            kernel_regex=args.kernel,
            backward=args.backward,
        )
    except CountersUnavailable as exc:
        raise Unavailable(f"--counters: {exc}") from None
    print(result.text())
    console.print(
        f"wrote {out / 'counters.json'}, {out / 'counters.ncu-rep'} (read via {result.source})", soft_wrap=True
    )
    return 1 if all(r.get("error") for r in result.rows) else 0


def _runahead(args: argparse.Namespace, console: Console) -> int:
    from fuselab.profile.runahead import MLPConfig, run_runahead

    cfg = MLPConfig(steps=args.steps, layers=args.layers, dim=args.dim, batch=args.batch, device=args.device)
    out = args.out or Path("fuselab-profile") / "runahead"
    study = run_runahead(cfg, out)
    print(study.summary())
    for r in study.runs:
        console.print(f"{r.name}: {r.timeline_path}, {r.trace_path}")
    console.print(f"numbers in {out / 'runahead.json'}")
    return 0
