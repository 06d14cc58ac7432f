"""`fuselab bench OP`: sweep impls x dtypes x shapes with the harness; table, JSON, CSV and a plot.

Exit status: 0 when at least one case was measured (or every case was skipped on purpose); 1 when none was and
some failed or were unavailable; 2 on bad input.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
from collections.abc import Callable
from pathlib import Path

from rich.console import Console

from fuselab.bench import distributed
from fuselab.bench.ceilings import busy_note, get_ceilings, peak_tflops
from fuselab.bench.compare import BaselineComparison, compare_to_baseline, load_rows
from fuselab.bench.compiled import cache_lookups
from fuselab.bench.dtypes import short_name
from fuselab.bench.env import provenance
from fuselab.bench.record import Row, Status
from fuselab.bench.results import (
    ABOVE_MARK,
    NOISY_LEGEND,
    busy_line,
    first_line,
    fmt_fixed,
    fmt_float,
    fmt_plain,
    fmt_rate,
    make_table,
    plot_metric,
    print_table,
    row_is_noisy,
    write_csv,
    write_json,
)
from fuselab.bench.shapes import LAYOUTS, format_shape, parse_random, plot_ratios
from fuselab.bench.timer import Timing
from fuselab.cli._args import add_op_arguments, check_writable, load_op, non_negative, percent, positive, resolve
from fuselab.evaluate import (
    CEILING_SHARES,
    above_ceiling,
    bench_op,
    layout_ratios,
    past_ceilings,
    rival_ratios,
    shape_ratios,
)
from fuselab.evaluate.choices import bench_cases, speed_axis
from fuselab.evaluate.warm import WarmUp, done_keys, warm_cases, warm_up
from fuselab.ops.registry import Op


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmark an op's implementations (or your function) side by side")
    add_op_arguments(p)
    p.add_argument("--out", type=Path, help="results: FILE.json (with FILE.jsonl as the resumable log) or FILE.jsonl")
    p.add_argument("--csv", type=Path, help="also write the rows as CSV")
    p.add_argument("--plot", type=Path, help="also plot GB/s against size (PNG)")
    p.add_argument(
        "--plot-calls",
        type=Path,
        help="also plot the host's and the end-to-end us per back-to-back call against size (PNG; --call-cost-ms)",
    )
    p.add_argument("--compare", type=Path, metavar="BASELINE", help="compare with an earlier run (its --out .json or "
                   ".jsonl), case by case; exit 1 on a regression past --threshold")  # fmt: skip
    p.add_argument("--threshold", type=percent, default=5.0,
                   help="with --compare: %% slower that is a regression, as 5 or 5%% (default 5)")  # fmt: skip
    p.add_argument("--rep-ms", type=positive(float), default=500.0, help="time to spend repeating each case (ms)")
    p.add_argument("--warmup-ms", type=non_negative(float), default=200.0, help="minimum warm-up per case (ms)")
    p.add_argument(
        "--rounds",
        type=positive(int),
        default=5,
        help="the impls of a case take turns, each timing 1/ROUNDS of its repetitions per round (1: one after another)",
    )
    p.add_argument("--cuda-graph", action="store_true", help="time CUDA-graph replays (launch-bound kernels)")
    p.add_argument(
        "--backward", action="store_true", help="also time forward + backward (impls with a backward), as pass rows"
    )
    p.add_argument(
        "--shapes",
        metavar="random:N",
        help="draw N shapes from the op's random_shape (instead of --shape) and report each impl's time ratio to the "
        "best of the op's peers (torch and compile; attention: the SDPA backends): worst, p95, geometric mean, the "
        "five worst shapes (--plot: ratio against size)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the --shapes draw (default 0)")
    p.add_argument(
        "--warm-jobs",
        type=non_negative(int),
        default=0,
        metavar="K",
        help="before timing, call the cases that compile code in K worker processes (compiled impls; on a GPU every "
        "impl, for Triton's JIT), each calling every K-th case once, untimed, so that the timed run's compiles read "
        "Inductor's and Triton's on-disk caches (big --shapes draws on a GPU; not under --gpus/torchrun). Default 0: "
        "off",
    )
    p.add_argument(
        "--layout",
        choices=LAYOUTS,
        action="append",
        help="inputs' memory layout (default contiguous); may repeat: each case in each layout, side by side, and with "
        "contiguous among them a table of each other layout's time over the contiguous time plus the copy PyTorch "
        "makes",
    )
    p.add_argument("--no-flush", action="store_true", help="do not flush L2 between repetitions")
    p.add_argument(
        "--isolate",
        action="store_true",
        help="on many GPUs: one GPU times at a time while the others prepare and compile (default: all time at once)",
    )
    p.add_argument(
        "--call-cost-ms",
        type=non_negative(float),
        default=100.0,
        help="time per impl and case for the host cost and end-to-end time of back-to-back calls (0: skip)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    op, selection = resolve(args)
    baseline = load_rows(args.compare) if args.compare else None  # a bad baseline stops before any timing
    if args.out and args.out.suffix not in (".json", ".jsonl"):
        raise ValueError(f"--out {args.out}: give FILE.json (with FILE.jsonl as the resumable log) or FILE.jsonl")
    for path in (args.out, args.csv, args.plot, args.plot_calls):
        check_writable(path)
    if args.plot_calls and args.call_cost_ms == 0:
        raise ValueError("--plot-calls needs the cost of a call: leave --call-cost-ms above 0")
    device = selection.device
    if args.cuda_graph and not device.startswith("cuda"):
        raise ValueError(f"--cuda-graph needs a CUDA device; this run is on {device}")
    console = Console(highlight=False)
    chosen = bench_cases(op, device, selection.shapes, selection.impls, random_draw(args), args.seed)
    for note in chosen.notes:
        print(note, file=sys.stderr)
    selection = dataclasses.replace(selection, shapes=chosen.shapes, impls=chosen.impls)
    drawn = chosen.shapes if chosen.drawn else []
    log = args.out.with_suffix(".jsonl") if args.out and args.out.suffix == ".json" else args.out
    timing = Timing(
        rep_ms=args.rep_ms, warmup_ms=args.warmup_ms, cuda_graph=args.cuda_graph, flush_l2=not args.no_flush
    )
    distributed.set_isolate(args.isolate)
    passes = ("forward", "forward+backward") if args.backward else ("forward",)
    warm = None
    if args.warm_jobs:  # the compiles first, spread over processes; the timed run's then read the caches
        cases = warm_cases(op, selection, passes, done=done_keys(log))
        loader = functools.partial(load_op, args.op, args.nargs)
        warm = warm_up(loader, cases, jobs=args.warm_jobs, device=device)  # a line per worker on stderr
        console.print(warm.summary(), soft_wrap=True)
    with cache_lookups() as lookups:
        rows = bench_op(
            op,
            selection,
            out=log,
            timing=timing,
            rounds=args.rounds,
            passes=passes,
            call_cost_ms=args.call_cost_ms,
            refuse_early=True,
        )
    if not distributed.is_main():  # under torchrun, rank 0 prints and writes for all
        return 0
    measured = [r for r in rows if r.measured]
    several = ("layout",) if len(selection.layouts) > 1 else ()  # a column for the layout where there are several
    if measured:
        cols = columns(op.defaults.baseline, [*several, *op.options], op.bound, args.backward)
        cols += [("rank", "rank", fmt_plain)] if distributed.active() else []
        past = {share: functools.partial(_mark_past, share=share) for share in CEILING_SHARES}
        table = make_table(measured, cols, title=f"bench {op.name}", mark_noisy="median_ms", marks=past)
        print_table(table, console)
    if any(row_is_noisy(r) for r in measured):
        console.print(NOISY_LEGEND, soft_wrap=True)
    if busy_line(measured):
        console.print(f"[yellow]{busy_line(measured)}[/yellow]", soft_wrap=True)
    for line in not_measured_lines(rows) + above_ceiling_lines(measured):
        console.print(line, soft_wrap=True)
    ceilings = get_ceilings(device, measure=False)
    if measured and busy_note(ceilings):
        console.print(f"[yellow]{busy_note(ceilings)}[/yellow]", soft_wrap=True)
    if warm is not None and warm.cases:  # did the warm-up pay? graphs the timed run read from the caches
        console.print(timed_compiles_line(lookups), soft_wrap=True)
    summary, rivals = None, []
    by = (*op.options, *(["pass"] if args.backward else []))
    if drawn:
        rows, summary = shape_ratios(op, rows, (*several, *by))
        rivals = rival_ratios(op, rows, (*several, *by))
        shown = [*SUMMARY_COLUMNS[:2], *[(k, k, fmt_plain) for k in (*several, *by)], *SUMMARY_COLUMNS[2:]]
        title = f"{op.name}: time / best of {', '.join(op.defaults.peers)}"
        print_table(make_table(summary, shown, title=title), console)
        if rivals:
            title = f"{op.name}: time / best of {', '.join(op.defaults.rivals)}"
            print_table(make_table(rivals, shown, title=title), console)
    if laid := layout_ratios(op, rows, by):
        shown = [*SUMMARY_COLUMNS[:2], *[(k, k, fmt_plain) for k in ("layout", *by)], *SUMMARY_COLUMNS[2:]]
        title = f"{op.name}: time / (contiguous time + the copy {op.defaults.baseline} makes)"
        print_table(make_table(laid, shown, title=title), console)
    if args.out and args.out.suffix == ".json":
        meta = {"env": provenance(device), "ceilings": ceilings}
        if warm is not None:  # how the compiles were made: warmed in workers, then read from the caches
            meta["warm"] = warm_meta(warm, lookups)
        if drawn:
            peers = list(op.defaults.peers)
            meta["random"] = {"n": len(drawn), "seed": args.seed, "layouts": list(selection.layouts), "peers": peers}
            meta["ratios"] = summary
            if rivals:
                meta["random"]["rivals"] = list(op.defaults.rivals)
                meta["rival_ratios"] = rivals
        if laid:
            meta["layout_ratios"] = laid
        write_json(rows, args.out, meta=meta)
        console.print(f"wrote {args.out} (log: {log})")
    if args.csv:
        write_csv(rows, args.csv)
    if args.plot and drawn:
        plot_ratios(rows, args.plot, title=op.name, axis=op.defaults.axis)
    elif args.plot:
        points, x, xlabel = speed_axis(rows, op)
        y, ylabel = ("tflops", "TFLOP/s") if op.bound == "compute" else ("gbps", "GB/s")
        ceiling = (ceilings or {}).get("copy_gbps") if op.bound == "memory" else panel_peak(ceilings)
        plot_metric(
            points, args.plot, x=x, y=y, ceiling=ceiling, xlabel=xlabel, ylabel=ylabel, title=op.name, panel="panel"
        )
    if args.plot_calls:
        plot_calls(rows, op, args.plot_calls)
    if baseline is not None:
        compared = compare_to_baseline(rows, baseline, args.threshold / 100)
        print_comparison(compared, args.compare, console)
        if compared.regressions:
            return 1
    return exit_status(rows)


def timed_compiles_line(lookups: dict[str, int]) -> str:
    """After a warm-up: how many graphs the timed run read from Inductor's cache and how many it compiled itself."""
    line = f"the timed run's compiles: {lookups['hit']} graphs read from the cache, {lookups['miss']} compiled anew"
    return line + (f", {lookups['bypass']} not cacheable" if lookups["bypass"] else "")


def warm_meta(warm: WarmUp, lookups: dict[str, int]) -> dict[str, object]:
    """The results file's `warm`: the warm-up's jobs, seconds and counts, and the timed run's cache lookups."""
    return {**warm.meta(), "timed_run_cache": dict(lookups)}


def plot_calls(rows: list[Row], op: Op, path: Path) -> None:
    """Host us and end-to-end us per back-to-back call against size: one line per impl and measure, a panel per
    dtype and pass (log-log)."""
    points, x, xlabel = speed_axis(rows, op)
    lines = [
        {**p, "us": p[field], "series": f"{p['impl']} {what}"}
        for p in points
        for field, what in (("host_us", "host"), ("e2e_us", "end to end"))
        if p.get(field) is not None
    ]
    plot_metric(
        lines, path, x=x, y="us", series="series", panel="panel", xlabel=xlabel, ylabel="us per call",
        title=f"{op.name}: the cost of a call", logy=True,
    )  # fmt: skip


def panel_peak(ceilings: dict | None) -> Callable[[list[dict]], float | None]:
    """A plot panel's ceiling for a compute-bound op: the matmul peak of its rows' dtype (`peak_tflops`)."""
    return lambda rows: peak_tflops(ceilings, str(rows[0]["dtype"])) if rows else None


def print_comparison(compared: BaselineComparison, path: Path, console: Console) -> None:
    """The cases against the baseline, slowest change first, regressions marked; then one line of counts."""
    records = []
    for c in compared.changes:
        fields = c.case.to_json()
        rest = " ".join(f"{k}={v}" for k, v in fields.items() if k not in ("op", "impl", "dtype", "shape"))
        verdict = " ".join(filter(None, ["[red]regressed[/red]" if c.regressed else "", "(noisy)" if c.noisy else ""]))
        records.append({**fields, "also": rest, "baseline_ms": c.baseline_ms, "now_ms": c.now_ms, "ratio": c.ratio,
                        "verdict": verdict})  # fmt: skip
    cols = [("impl", "impl", fmt_plain), ("dtype", "dtype", short_name), ("shape", "shape", fmt_plain)]
    cols += [("also", "case", fmt_plain)]
    cols += [("baseline_ms", "baseline ms", fmt_float(4)), ("now_ms", "now ms", fmt_float(4))]
    cols += [("ratio", "now / baseline", fmt_fixed(3)), ("verdict", "", fmt_plain)]
    if records:
        print_table(make_table(records, cols, title=f"against {path}"), console)
    if compared.elsewhere:
        console.print(f"[yellow]{compared.elsewhere}[/yellow]: the ratios compare the devices too", soft_wrap=True)
    if any(c.noisy for c in compared.changes):
        console.print("(noisy): a noisy timing on either side; rerun before trusting that ratio", soft_wrap=True)
    console.print(
        f"{len(compared.regressions)} of {len(compared.changes)} cases regressed past "
        f"{100 * compared.threshold:g}% slower; {compared.only_now} new, {compared.only_baseline} only in the baseline"
    )


def exit_status(rows: list[Row]) -> int:
    """0 when a case was measured or every one was skipped on purpose; 1 when nothing was measured otherwise."""
    if any(r.measured for r in rows):
        return 0
    return 0 if all(r.status is Status.SKIPPED for r in rows) else 1


def fmt_worst(worst: list[dict]) -> str:
    return ", ".join(f"{format_shape(w['shape'])} {w['ratio']:.2f}" for w in worst)


SUMMARY_COLUMNS = [
    ("impl", "impl", fmt_plain),
    ("dtype", "dtype", fmt_plain),
    ("shapes", "shapes", fmt_plain),
    ("worst", "worst", fmt_fixed(3)),
    ("p95", "p95", fmt_fixed(3)),
    ("geomean", "geomean", fmt_fixed(3)),
    ("worst_shapes", "worst shapes (ratio)", fmt_worst),
]


def random_draw(args: argparse.Namespace) -> int | None:
    """N of --shapes random:N (None without --shapes)."""
    if not args.shapes:
        return None
    n = parse_random(args.shapes)
    if n is None:
        raise ValueError(f"--shapes takes random:N, got {args.shapes!r} (for given shapes use --shape)")
    if args.shape:
        raise ValueError("give either --shapes random:N or --shape, not both")
    return n


def above_ceiling_lines(rows: list[Row]) -> list[str]:
    """One line per impl and ceiling its rate passed (ABOVE_CEILING_PCT; its cells carry ABOVE_MARK), naming its
    cases and what it means."""
    by_impl: dict[tuple[str, str], list[str]] = {}
    for r in rows:
        above = above_ceiling(r)
        if above is not None:
            pct, share = above
            case = f"{short_name(r.case.dtype)} {format_shape(r.case.shape)} {pct:.0f}%"
            by_impl.setdefault((r.case.impl, CEILING_SHARES[share]), []).append(case)
    return [
        f"{ABOVE_MARK} [yellow]{impl}[/yellow] at {', '.join(cases)} of {note}"
        for (impl, note), cases in by_impl.items()
    ]


def _mark_past(row: Row, share: str) -> str:
    return ABOVE_MARK if share in past_ceilings(row) else ""


def not_measured_lines(rows: list[Row]) -> list[str]:
    """One line per impl, status and reason for the rows that were not measured, with their dtypes and case count."""
    groups: dict[tuple[str, str, str], list[Row]] = {}
    for r in rows:
        if r.error:
            groups.setdefault((r.case.impl, str(r.status), first_line(r.error)), []).append(r)
    lines = []
    for (impl, status, reason), members in groups.items():
        dtypes = ", ".join(dict.fromkeys(short_name(r.case.dtype) for r in members))
        cases = f"{len(members)} case{'s' if len(members) > 1 else ''}"
        style = "yellow" if status in ("skipped", "unavailable") else "red"
        lines.append(f"[{style}]{impl}[/{style}] ({dtypes}; {cases}) {status}: {reason}")
    return lines


def columns(baseline: str, options: list[str], bound: str = "memory", backward: bool = False) -> list:
    """The table's columns: GB/s and % of the copy ceiling for a memory-bound op, TFLOP/s (rested and back to
    back) and % of the matmul ceiling for a compute-bound one."""
    speed = (
        [
            ("gbps", "GB/s", fmt_rate),
            ("pct_copy", "% copy", fmt_fixed(1)),
            ("pct_copy_same", "% copy same size", fmt_fixed(1)),
        ]
        if bound == "memory"
        else [
            ("tflops", "TFLOP/s", fmt_rate),
            ("sustained_tflops", "back to back", fmt_rate),
            ("pct_peak", "% peak", fmt_fixed(1)),
        ]
    )
    return [
        ("impl", "impl", fmt_plain),
        ("dtype", "dtype", short_name),
        ("shape", "shape", fmt_plain),
        *[(k, k, fmt_plain) for k in options],
        *([("pass", "pass", fmt_plain)] if backward else []),
        ("median_ms", "median ms", fmt_float(4)),
        ("iqr_ms", "IQR ms", fmt_float(2)),
        *speed,
        (f"speedup_vs_{baseline}", f"vs {baseline}", fmt_fixed(2)),
        ("host_us", "host us/call", fmt_fixed(1)),
        ("e2e_us", "e2e us/call", fmt_fixed(1)),
        ("rel_err", "rel err", fmt_float(2)),
        ("compile_s", "compile s", fmt_fixed(1)),
    ]
