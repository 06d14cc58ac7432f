"""Every shape: per op, shapes drawn by its own `random_shape` with a fixed seed, every impl timed on each
against the fastest of the op's PyTorch peers (`Defaults.peers`): worst, 95th percentile and geometric mean of the time
ratio, the five worst shapes, and the ratio against size. Generic over the ops; nothing here names one."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from fuselab.bench.memory import format_bytes
from fuselab.bench.record import Status
from fuselab.bench.shapes import format_shape, plot_ratios
from fuselab.evaluate import Selection, bench_op, draw_op_shapes, shape_ratios
from fuselab.ops.registry import Op
from fuselab.report.doc import Doc
from fuselab.report.runner import Context
from fuselab.report.sections._common import each_op, first_line
from fuselab.report.sections.ops import bench_impls, unavailable_notes

NAME = "every_shape"
ROW_FIELDS = ("impl", "dtype", "shape", "median_ms", "ratio", "best_peer", "status", "error")


def every_shape_section(ops: Sequence[Op] | None = None) -> Callable[[Context, Doc], dict]:
    """The section over `ops` (default: every registered op, as the report runs it)."""

    def section(ctx: Context, doc: Doc) -> dict:
        budget = ctx.budget[NAME]
        doc.text(_intro(budget))
        ops_results = each_op(ops, lambda op: _one_op(ctx, doc, op, budget), doc)
        return {"n": budget["n"], "seed": budget["seed"], "ops": ops_results}

    section.__name__ = f"{NAME}_section"
    return section


def _intro(budget: dict) -> str:
    cap = []
    if budget.get("max_bytes"):
        cap.append(f"{format_bytes(budget['max_bytes'])} moved")
    if budget.get("max_flops"):
        cap.append(f"{budget['max_flops']:.3g} FLOPs")
    capped = (
        f" On this device a call is capped at {' and '.join(cap)} (the op's cost model, float32): a draw above the cap "
        "has its first dimension (batch, rows) cut to land log-uniformly between 1/64 of the cap and the cap; the "
        "rest of the draw (row width, head dimension, sequence length) is kept."
        if cap
        else ""
    )
    compiled = "" if budget.get("compiled") else " Compiled impls (one torch.compile per shape) are not timed here."
    return (
        f"Each op draws **{budget['n']} shapes** from its own `random_shape` with **seed {budget['seed']}** (fixed "
        f"for this mode: the same shapes on every run, as `fuselab bench OP --shapes random:{budget['n']} --seed "
        f"{budget['seed']}` draws them), "
        "and every impl is timed on each, side by side on one input, at the options and dtypes of the op's "
        "section. The ratio is an impl's time over the fastest of the op's PyTorch peers on the same shape "
        "(below 1: faster than the best peer). Per impl: the worst ratio, the 95th percentile, the geometric "
        f"mean, and the five worst shapes.{capped}{compiled}"
    )


def _one_op(ctx: Context, doc: Doc, op: Op, budget: dict) -> dict:
    if op.defaults.random_shape is None:
        doc.text(f"`{op.name}` has no `random_shape` in its spec: no shapes drawn.")
        return {"skipped": "no random_shape in the op's spec"}
    plan = op.report_plan(ctx.mode)
    dtypes = list(plan["bench_dtypes"])[: budget["dtypes"]] if budget.get("dtypes") else list(plan["bench_dtypes"])
    sweeps = plan["bench_sweeps"]
    options = op.resolve_options(sweeps[0].get("options") if sweeps else None)
    shapes = draw_op_shapes(
        op,
        budget["n"],
        budget["seed"],
        max_bytes=budget.get("max_bytes"),
        max_flops=budget.get("max_flops"),
        options=options,
    )
    impls = bench_impls(ctx, op, compiled=bool(budget.get("compiled")))
    left = [n for n in op.impls if n not in impls]
    rows = bench_op(
        op,
        Selection(impls=impls, dtypes=dtypes, shapes=shapes, options=options, device=ctx.device),
        out=ctx.log(NAME, op.name),
        timing=budget["timing"],
        show_progress=ctx.show_progress,
        call_cost_ms=0.0,
        max_call_ms=ctx.budget.get("max_call_ms"),
    )
    rows, summary = shape_ratios(op, rows)
    peers = [p for p in op.defaults.peers if p in op.impls]
    timed_peers = sorted({r.best_peer for r in rows if r.best_peer})
    opts = ", ".join(f"{k}={v}" for k, v in options.items())
    doc.text(
        f"{len(shapes)} shapes drawn ({', '.join(dtypes)}{', ' + opts if opts else ''}); peers: "
        f"{', '.join(f'`{p}`' for p in peers) or 'none registered'}"
        f"{' (timed here: ' + ', '.join(timed_peers) + ')' if timed_peers else ''}."
    )
    if left:
        doc.text(left_out(op, left))
    for dtype in dtypes:
        mine = [s for s in summary if s["dtype"] == dtype]
        if not mine:
            doc.text(f"{dtype}: no impl has a ratio (no peer was timed on any shape).")
            continue
        doc.table(
            ["impl", "shapes", "worst", "p95", "geomean", "worst five shapes (ratio)"],
            [
                [
                    s["impl"],
                    s["shapes"],
                    f"{s['worst']:.3g}",
                    f"{s['p95']:.3g}",
                    f"{s['geomean']:.3g}",
                    ", ".join(f"{format_shape(tuple(w['shape']))} ({w['ratio']:.2f})" for w in s["worst_shapes"]),
                ]
                for s in mine
            ],
            caption=f"{op.name}, {dtype}: time / best of {', '.join(peers)}, over {len(shapes)} random shapes",
        )
    notes = unavailable_notes(rows)
    if notes:
        doc.text("Not timed here:\n\n" + notes)
    failed = [r for r in rows if r.error and r.status is Status.ERROR]
    if failed:
        doc.text(f"{len(failed)} case(s) failed, e.g. `{failed[0].case.impl}` at "
                 f"{format_shape(failed[0].case.shape)}: {first_line(failed[0].error)}")  # fmt: skip
    if any(r.ratio is not None for r in rows):
        label = op.defaults.axis[0] if op.defaults.axis else None
        path = plot_ratios(rows, ctx.plot(f"{NAME}_{op.name}.png"), title=op.name, axis=op.defaults.axis)
        doc.image(path, f"{op.name}: time / best peer against {label or 'size'}, one point per shape and impl.")
    return {
        "shapes": [list(s) for s in shapes],
        "dtypes": dtypes,
        "options": options,
        "peers": peers,
        "impls": impls,
        "not_timed": left,
        "summary": summary,
        "rows": [{k: _json(r.field(k)) for k in ROW_FIELDS} for r in rows],
    }


def _json(v: object) -> object:
    return list(v) if isinstance(v, tuple) else str(v) if isinstance(v, Status) else v


def left_out(op: Op, names: Sequence[str]) -> str:
    """One line naming the impls a section leaves out on purpose, each with why."""
    compiled = "compiled once per shape: too slow for this mode"
    interpreted = "Triton under the CPU interpreter: checked, never timed"
    why = [f"`{n}` ({compiled if op.impls[n].compiled else interpreted})" for n in names]
    return f"Left out here: {', '.join(why)}."
