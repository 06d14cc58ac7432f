"""`fuselab bench OP`: sweep impls x dtypes x shapes with the harness; table, JSON, CSV and a plot."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from fuselab.bench.ceilings import get_ceilings
from fuselab.bench.env import environment
from fuselab.bench.results import fmt_fixed, fmt_float, fmt_plain, make_table, plot_metric, write_csv, write_json
from fuselab.bench.shapes import LAYOUTS, add_ratios, draw_shapes, parse_random, plot_ratios, summarize
from fuselab.cli._args import add_op_arguments, resolve
from fuselab.ops.evaluate import bench_op, peer_fields
from fuselab.ops.registry import Op


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
    p.add_argument(
        "--shapes",
        metavar="random:N",
        help="draw N shapes from the op's random_shape (instead of --shape) and report each impl's time ratio to the "
        "best of torch and compile: worst, p95, geometric mean, the five worst shapes (--plot: ratio against size)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the --shapes draw (default 0)")
    p.add_argument("--layout", choices=LAYOUTS, default="contiguous", help="inputs' memory layout (default contiguous)")
    p.add_argument("--no-flush", action="store_true", help="do not flush L2 between repetitions")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    op, kwargs = resolve(args)
    drawn = random_shapes(op, args, kwargs)
    log = args.out.with_suffix(".jsonl") if args.out and args.out.suffix == ".json" else args.out
    timing = {
        "rep_ms": args.rep_ms,
        "warmup_ms": args.warmup_ms,
        "cuda_graph": args.cuda_graph,
        "flush_l2": not args.no_flush,
    }
    rows = bench_op(op, out=log, timing=timing, rounds=args.rounds, layout=args.layout, **kwargs)
    console = Console()
    console.print(make_table(rows, columns(op.baseline, list(op.options)), title=f"bench {op.name}"))
    ceilings = get_ceilings(kwargs["device"], measure=False)
    summary = None
    if drawn:
        add_ratios(rows, PEERS, peer_fields(op))
        summary = summarize(rows, ("impl", "dtype", *op.options))
        shown = [*SUMMARY_COLUMNS[:2], *[(k, k, fmt_plain) for k in op.options], *SUMMARY_COLUMNS[2:]]
        console.print(make_table(summary, shown, title=f"{op.name}: time / best of {', '.join(PEERS)}"))
    if args.out and args.out.suffix == ".json":
        meta = {"env": environment(kwargs["device"]), "ceilings": ceilings}
        if drawn:
            meta["random"] = {"n": len(drawn), "seed": args.seed, "layout": args.layout, "peers": list(PEERS)}
            meta["ratios"] = summary
        write_json(rows, args.out, meta=meta)
        console.print(f"wrote {args.out} (log: {log})")
    if args.csv:
        write_csv(rows, args.csv)
    if args.plot and drawn:
        plot_ratios(rows, args.plot, title=op.name)
    elif args.plot:
        ceiling = ceilings["copy_gbps"] if ceilings else None
        points, x, xlabel = plot_axis(rows)
        plot_metric(points, args.plot, x=x, y="gbps", ceiling=ceiling, xlabel=xlabel, ylabel="GB/s", title=op.name)
    failed = [r for r in rows if r.get("error")]
    if failed:
        console.print(f"[yellow]{len(failed)} case(s) failed or were unavailable (see the error column)[/yellow]")
    return 0


def fmt_shape(shape: list[int]) -> str:
    return "x".join(map(str, shape)) or "scalar"


def fmt_worst(worst: list[dict]) -> str:
    return ", ".join(f"{fmt_shape(w['shape'])} {w['ratio']:.2f}" for w in worst)


PEERS = ("torch", "compile")  # the ratio's denominator: the fastest of these that ran the case
SUMMARY_COLUMNS = [
    ("impl", "impl", fmt_plain),
    ("dtype", "dtype", fmt_plain),
    ("shapes", "shapes", fmt_plain),
    ("worst", "worst", fmt_fixed(3)),
    ("p95", "p95", fmt_fixed(3)),
    ("geomean", "geomean", fmt_fixed(3)),
    ("worst_shapes", "worst shapes (ratio)", fmt_worst),
]


def random_shapes(op: Op, args: argparse.Namespace, kwargs: dict) -> list[tuple[int, ...]]:
    """The shapes drawn for --shapes random:N (also set in kwargs), or [] without --shapes."""
    if not args.shapes:
        return []
    n = parse_random(args.shapes)
    if n is None:
        raise ValueError(f"--shapes takes random:N, got {args.shapes!r} (for given shapes use --shape)")
    if args.shape:
        raise ValueError("give either --shapes random:N or --shape, not both")
    if op.random_shape is None:
        raise ValueError(f"op {op.name!r} has no random_shape in its spec, so --shapes random:N cannot draw for it")
    kwargs["shapes"] = draw_shapes(op.random_shape, n, args.seed)
    return kwargs["shapes"]


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
