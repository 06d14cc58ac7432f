"""`fuselab bench OP`: sweep impls x dtypes x shapes with the harness; table, JSON, CSV and a plot."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from fuselab.bench import distributed
from fuselab.bench.ceilings import get_ceilings
from fuselab.bench.env import environment
from fuselab.bench.results import fmt_fixed, fmt_float, fmt_plain, make_table, plot_metric, write_csv, write_json
from fuselab.cli._args import add_op_arguments, resolve
from fuselab.ops.evaluate import bench_op


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmark an op's implementations (or your function) side by side")
    add_op_arguments(p)
    p.add_argument("--out", type=Path, help="results: FILE.json (with FILE.jsonl as the resumable log) or FILE.jsonl")
    p.add_argument("--csv", type=Path, help="also write the rows as CSV")
    p.add_argument("--plot", type=Path, help="also plot GB/s against size (PNG)")
    p.add_argument("--rep-ms", type=float, default=500.0, help="time to spend repeating each case (ms)")
    p.add_argument("--warmup-ms", type=float, default=200.0, help="minimum warm-up per case (ms)")
    p.add_argument(
        "--rounds",
        type=int,
        default=5,
        help="the impls of a case take turns, each timing 1/ROUNDS of its repetitions per round (1: one after another)",
    )
    p.add_argument("--cuda-graph", action="store_true", help="time CUDA-graph replays (launch-bound kernels)")
    p.add_argument("--no-flush", action="store_true", help="do not flush L2 between repetitions")
    p.add_argument(
        "--isolate",
        action="store_true",
        help="on many GPUs: one GPU times at a time while the others prepare and compile (default: all time at once)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    op, kwargs = resolve(args)
    log = args.out.with_suffix(".jsonl") if args.out and args.out.suffix == ".json" else args.out
    timing = {
        "rep_ms": args.rep_ms,
        "warmup_ms": args.warmup_ms,
        "cuda_graph": args.cuda_graph,
        "flush_l2": not args.no_flush,
    }
    distributed.set_isolate(args.isolate)
    rows = bench_op(op, out=log, timing=timing, rounds=args.rounds, **kwargs)
    if not distributed.is_main():  # under torchrun, rank 0 prints and writes for all
        return 0
    console = Console()
    shown = columns(op.baseline, list(op.options)) + ([("rank", "rank", fmt_plain)] if distributed.active() else [])
    console.print(make_table(rows, shown, title=f"bench {op.name}"))
    ceilings = get_ceilings(kwargs["device"], measure=False)
    if args.out and args.out.suffix == ".json":
        meta = {"env": environment(kwargs["device"]), "ceilings": ceilings}
        write_json(rows, args.out, meta=meta)
        console.print(f"wrote {args.out} (log: {log})")
    if args.csv:
        write_csv(rows, args.csv)
    if args.plot:
        ceiling = ceilings["copy_gbps"] if ceilings else None
        points, x, xlabel = plot_axis(rows)
        plot_metric(points, args.plot, x=x, y="gbps", ceiling=ceiling, xlabel=xlabel, ylabel="GB/s", title=op.name)
    failed = [r for r in rows if r.get("error")]
    if failed:
        console.print(f"[yellow]{len(failed)} case(s) failed or were unavailable (see the error column)[/yellow]")
    return 0


def plot_axis(rows: list[dict]) -> tuple[list[dict], str, str]:
    """(rows, x field, x label) for the GB/s plot: the element count where it varies across the rows, else the last
    dimension (softmax sweeps the row width at a fixed element count), added to each row as `last_dim`."""
    if len({r.get("numel") for r in rows if not r.get("error")}) > 1:
        return rows, "numel", "elements"
    return [{**r, "last_dim": (r.get("shape") or [1])[-1]} for r in rows], "last_dim", "last dimension"


def columns(baseline: str, options: list[str]) -> list:
    return [
        ("impl", "impl", fmt_plain),
        ("dtype", "dtype", fmt_plain),
        ("shape", "shape", fmt_plain),
        *[(k, k, fmt_plain) for k in options],
        ("median_ms", "median ms", fmt_float(4)),
        ("iqr_ms", "IQR ms", fmt_float(2)),
        ("gbps", "GB/s", fmt_fixed(0)),
        ("pct_copy", "% copy", fmt_fixed(1)),
        ("pct_copy_same", "% copy same size", fmt_fixed(1)),
        (f"speedup_vs_{baseline}", f"vs {baseline}", fmt_fixed(2)),
        ("rel_err", "rel err", fmt_float(2)),
        ("compile_s", "compile s", fmt_fixed(1)),
    ]
