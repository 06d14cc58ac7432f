"""The cost of one call: per op, a ladder of sizes from tiny to large (its profile shape grown or shrunk,
`ladder_shapes`), each impl called back to back (`call_cost`: host us and end-to-end us per call) beside its device
time; on a GPU also the baseline and the fused impls under torch.compile, with and without CUDA graphs. Per impl the
size from which the GPU (on the CPU: the work) sets the time. Generic over the ops; nothing here names one."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from fuselab.bench.dtypes import DTYPES
from fuselab.bench.memory import format_bytes
from fuselab.bench.results import plot_metric
from fuselab.bench.shapes import format_shape
from fuselab.evaluate import (
    GPU_BOUND_FACTOR,
    GROWTH_FACTOR,
    Selection,
    bench_op,
    bound_from,
    call_cost_row,
    compiled_call_cost,
    ladder_shapes,
)
from fuselab.ops.registry import Op
from fuselab.report.doc import Doc
from fuselab.report.runner import Context
from fuselab.report.sections._common import each_op, first_line
from fuselab.report.sections.every_shape import left_out
from fuselab.report.sections.ops import bench_impls, unavailable_notes

NAME = "call_cost"


def call_cost_section(ops: Sequence[Op] | None = None) -> Callable[[Context, Doc], dict]:
    """The section over `ops` (default: every registered op, as the report runs it)."""

    def section(ctx: Context, doc: Doc) -> dict:
        budget = ctx.budget[NAME]
        doc.text(_intro(ctx, budget))
        return {"criterion": _criterion(ctx), "ops": each_op(ops, lambda op: _one_op(ctx, doc, op, budget), doc)}

    section.__name__ = f"{NAME}_section"
    return section


def _criterion(ctx: Context) -> str:
    if ctx.on_gpu:
        return f"GPU-bound: end to end per call within {GPU_BOUND_FACTOR}x of the device time, at that size and above"
    return f"growing: end to end per call at least {GROWTH_FACTOR}x the smallest size's, at that size and above"


def _intro(ctx: Context, budget: dict) -> str:
    lo, hi = format_bytes(budget["min_bytes"]), format_bytes(budget["max_bytes"])
    text = (
        "What one call costs when calls come back to back, as in a model: each impl is called in a loop (no stream "
        "padding, no L2 flush; `fuselab.bench.timer.call_cost`), reading the clock once the last call is issued "
        "(**host µs per call**: Python, checks, allocation, the launch) and once the device is done (**end-to-end µs "
        "per call**), beside the device time of one call (`benchmark`, the op section's timing). The sizes are the "
        f"op's profile shape grown or shrunk (its largest leading dimension halved, its first doubled) to move {lo} "
        f"to {hi} per call by its cost model, at the dtype and options of its section; the x axis is those bytes."
    )
    if budget.get("max_flops"):
        text += f" Sizes above {budget['max_flops']:.3g} FLOPs per call are left out on this device."
    if ctx.on_gpu:
        text += (
            f" **GPU-bound from**: the smallest size from which end to end per call stays within "
            f"{GPU_BOUND_FACTOR}x of the device time; below it the host's cost of a call sets the speed (launch-bound)."
        )
    else:
        text += (
            " On the CPU there is no launch queue: a call runs on the host and returns when done, so host and end "
            f"to end nearly coincide and no size is 'GPU-bound'. **Grows from** says instead from which size a call "
            f"takes at least {GROWTH_FACTOR}x the smallest size's time: below it the fixed cost of a call (Python, "
            "dispatch, checks, allocation) is most of the time; above it the work is. Triton impls run under the CPU "
            "interpreter and are not timed; torch.compile modes (with and without CUDA graphs) are timed on a GPU only."
        )
    return text


def _one_op(ctx: Context, doc: Doc, op: Op, budget: dict) -> dict:
    plan = op.report_plan(ctx.mode)
    dtype = next(iter(plan["bench_dtypes"]))
    sweeps = plan["bench_sweeps"]
    options = op.resolve_options(sweeps[0].get("options") if sweeps else None)
    shapes = ladder_shapes(
        op,
        min_bytes=budget["min_bytes"],
        max_bytes=budget["max_bytes"],
        factor=budget["factor"],
        max_flops=budget.get("max_flops"),
        dtype=DTYPES[dtype],
        options=options,
    )
    if not shapes:
        doc.text("No size of the op's profile shape fits this device's ladder: nothing timed.")
        return {"skipped": "no shape on the ladder", "rows": []}
    impls = bench_impls(ctx, op, compiled=bool(budget.get("compiled")))
    left = [n for n in op.impls if n not in impls]
    bench = bench_op(
        op,
        Selection(impls=impls, dtypes=[dtype], shapes=shapes, options=options, device=ctx.device),
        out=ctx.log(NAME, op.name),
        timing=budget["timing"],
        show_progress=ctx.show_progress,
        call_cost_ms=budget["call_cost_ms"],
        max_call_ms=ctx.budget.get("max_call_ms"),
    )
    rows = [call_cost_row(r) for r in bench]
    rows += _compiled_rows(ctx, op, budget, shapes, dtype, options)
    for r in rows:  # rows of impls that did not run carry no cost; the op's model gives it
        if r.get("bytes") is None:
            r["bytes"], r["flops"] = op.case_cost(tuple(r["shape"]), DTYPES[dtype], options)
    opts = ", ".join(f"{k}={v}" for k, v in options.items())
    doc.text(f"{len(shapes)} sizes, {dtype}{', ' + opts if opts else ''}: "
             f"{', '.join(format_shape(s) for s in shapes)}.")  # fmt: skip
    if left:
        doc.text(left_out(op, left))
    series = list(dict.fromkeys((r["impl"], r["mode"]) for r in rows if not r.get("error")))
    bounds = {f"{impl} {mode}": bound_from(_of(rows, impl, mode), ctx.on_gpu) for impl, mode in series}
    _tables(ctx, doc, op, rows, shapes, series, bounds)
    notes = unavailable_notes([r for r in rows if r["mode"] == "eager"])
    if notes:
        doc.text("Not timed here:\n\n" + notes)
    failed = [r for r in rows if r.get("error") and r.get("status") == "error"]
    if failed:
        doc.text("Failed:\n\n" + "\n".join(f"- `{r['impl']}` ({r['mode']}) at {format_shape(tuple(r['shape']))}: "
                                           f"{first_line(r['error'])}" for r in failed[:5]))  # fmt: skip
    points = [
        {**r, "series": _label(r["impl"], r["mode"]), "panel": panel, "us": r[field]}
        for r in rows
        if not r.get("error")
        for panel, field in (("end to end per call", "e2e_us"), ("host per call", "host_us"))
    ]
    if points:
        path = plot_metric(
            points,
            ctx.plot(f"{NAME}_{op.name}.png"),
            x="bytes",
            y="us",
            series="series",
            panel="panel",
            xlabel="bytes moved per call (the op's cost model)",
            ylabel="µs per call, back to back",
            title=op.name,
            logy=True,
        )
        doc.image(path, f"{op.name}: time per call against size (log-log), one line per impl.")
    return {"dtype": dtype, "options": options, "shapes": [list(s) for s in shapes], "rows": rows, "bound_from": bounds}


def _compiled_rows(ctx: Context, op: Op, budget: dict, shapes: list, dtype: str, options: dict) -> list[dict]:
    """The baseline and the fused impls (those with kernels of their own) under each of the budget's torch.compile
    modes, on a GPU; later ones skipped, with the reason, once compile_deadline_s has passed."""
    modes = list(budget.get("compile_modes") or ()) if ctx.on_gpu else []
    names = [op.defaults.baseline, *[n for n, i in op.impls.items() if i.inspectable and n != op.defaults.baseline]]
    names = [n for n in names if n in op.impls and not op.impls[n].compiled]
    start = time.perf_counter()
    rows: list[dict] = []
    for mode in modes:
        for name in names:
            if time.perf_counter() - start > budget.get("compile_deadline_s", 0.0):
                skipped = {"op": op.name, "impl": name, "mode": mode, "dtype": dtype, "status": "skipped"}
                rows += [{**skipped, "shape": list(s), "error": "skipped: the section's compile time was spent"}
                         for s in shapes]  # fmt: skip
                continue
            rows += compiled_call_cost(
                op,
                name,
                mode,
                shapes,
                dtype=DTYPES[dtype],
                device=ctx.device,
                options=options,
                timing=budget["timing"],
                budget_ms=budget["call_cost_ms"],
            )
    return rows


def _of(rows: list[dict], impl: str, mode: str) -> list[dict]:
    return [r for r in rows if r["impl"] == impl and r["mode"] == mode]


def _label(impl: str, mode: str) -> str:
    return impl if mode == "eager" else f"{impl}, compile {mode}"


def _us(value: float | None) -> str:
    return "" if value is None else f"{value:.3g}"


def _tables(
    ctx: Context, doc: Doc, op: Op, rows: list[dict], shapes: list, series: list, bounds: dict[str, dict | None]
) -> None:
    """A pivot of end-to-end / host µs per call (impl x size) with where each becomes bound, then every row folded."""
    sizes = sorted({r["bytes"] for r in rows if r.get("bytes") is not None})
    word = "GPU-bound from" if ctx.on_gpu else "grows from"
    table = []
    for impl, mode in series:
        mine = {r["bytes"]: r for r in _of(rows, impl, mode)}
        cells = []
        for b in sizes:
            r = mine.get(b)
            if r is None:
                cells.append("")
            elif r.get("error"):
                cells.append(str(r.get("status") or "failed"))
            else:
                cells.append(f"{_us(r['e2e_us'])} / {_us(r['host_us'])}")
        bound = bounds.get(f"{impl} {mode}")
        timed = any(not r.get("error") for r in mine.values())
        where = format_bytes(bound["bytes"]) if bound else ("not within the ladder" if timed else "")
        table.append([_label(impl, mode), *cells, where])
    doc.table(
        ["impl \\ bytes per call", *[format_bytes(b) for b in sizes], word],
        table,
        caption=f"{op.name}: end to end / host µs per call, back to back",
    )
    timed = {r["impl"] for r in rows if r["mode"] == "eager" and not r.get("error")}
    full = [
        [
            _label(r["impl"], r["mode"]),
            format_shape(tuple(r["shape"])),
            format_bytes(r["bytes"]) if r.get("bytes") is not None else "",
            _us(r.get("device_us")),
            _us(r.get("host_us")),
            _us(r.get("e2e_us")),
            *([{True: "yes", False: "no"}.get(r.get("host_bound"), "")] if ctx.on_gpu else []),
            first_line(r.get("error")),
        ]
        for r in rows
        if r["mode"] != "eager" or r["impl"] in timed  # eager impls never timed are listed once, with the reason
    ]
    headers = ["impl", "shape", "bytes", "device µs", "host µs", "end-to-end µs", "note"]
    if ctx.on_gpu:  # on the CPU there is no queue to wait on: host and end-to-end are one time
        headers.insert(-1, "host-bound")
    doc.table(headers, full, caption="every call-cost row", folded=True)
