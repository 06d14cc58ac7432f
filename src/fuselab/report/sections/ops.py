"""One section per op, rendered from its spec and its records alone: correctness against float64, then speed in
GB/s against the copy ceiling (memory-bound ops) or TFLOP/s against the matmul ceiling (compute-bound ops), with
plots. The op adds its own words (`Op.prose`), never its own table code; nothing here names an op."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from fuselab.bench.ceilings import peak_tflops
from fuselab.bench.dtypes import DTYPES
from fuselab.bench.record import CheckRow, CheckSummary, Record, Row, Verdict, value
from fuselab.bench.results import ABOVE_MARK, NOISY_LEGEND, NOISY_MARK, busy_line, plot_metric, row_is_noisy
from fuselab.bench.shapes import format_shape
from fuselab.evaluate import (
    ABOVE_CEILING_PCT,
    CEILING_SHARES,
    Selection,
    bench_op,
    check_op,
    past_ceilings,
    summarize_checks,
)
from fuselab.ops.registry import Op
from fuselab.report.doc import Doc
from fuselab.report.runner import Context
from fuselab.report.sections._common import first_line, g3, ms, pow2, slim


def op_section(op: Op) -> Callable[[Context, Doc], dict]:
    """The report section of `op`: check every impl, bench them side by side as the op's report plan says."""

    def section(ctx: Context, doc: Doc) -> dict:
        plan = op.report_plan(ctx.mode)
        if op.prose is not None and op.prose.exists():
            doc.text(op.prose.read_text())
        check = _check(ctx, op, plan)
        summary = _check_doc(doc, op, check)
        impls = bench_impls(ctx, op)
        dtypes = plan["bench_dtypes"]
        sweeps = []
        for i, sweep in enumerate(plan["bench_sweeps"]):
            chosen = Selection(impls=impls, dtypes=dtypes, shapes=sweep["shapes"], options=sweep.get("options"),
                               device=ctx.device)  # fmt: skip
            rows = bench_op(
                op,
                chosen,
                out=ctx.log(op.name, "bench" if i == 0 else f"bench{i}"),
                timing=ctx.budget["timing"],
                show_progress=ctx.show_progress,
                passes=plan["passes"],
                max_call_ms=ctx.budget.get("max_call_ms"),
                slow_before=[r for rows in sweeps for r in rows],
            )
            sweeps.append(rows)
        if not ctx.on_gpu and any("triton" in name for name in op.impls):
            doc.text("On the CPU, Triton runs under its interpreter: it is checked for correctness above, never timed.")
        x = plan["x"]
        axis = op.defaults.axis
        xlabel = {"numel": "elements", "width": "row width", "axis": axis[0] if axis else "x"}.get(x, x)
        if sweeps:
            _bench_docs(ctx, doc, op, sweeps[0], x=x, xlabel=xlabel)
        for rows in sweeps[1:]:
            _extra_table(doc, op, rows)
        every = [r for rows in sweeps for r in rows]
        return {
            "check": [s.to_json() for s in summary],
            "check_failed": sum(r.status is Verdict.FAIL for r in check),
            "bench": [slim(plot_point(op, r)) for r in every],
            "bound": op.bound,
        }

    section.__name__ = f"{op.name}_section"
    return section


def plot_point(op: Op, row: Row) -> dict:
    """A row's JSON form with what its tables and plots run along: numel, width (the last dimension) and the op's
    own axis where it has one."""
    shape = row.case.shape
    out = {**row.to_json(), "numel": row.numel or math.prod(shape), "width": shape[-1] if shape else 1}
    if op.defaults.axis is not None:
        out["axis"] = op.defaults.axis[1](shape)
    return out


def bench_impls(ctx: Context, op: Op, compiled: bool = True) -> list[str]:
    """Every impl on a GPU; on the CPU all but Triton (its interpreter is for correctness, not speed); without
    `compiled`, none of the impls the harness compiles per case either."""
    return [
        name
        for name, impl in op.impls.items()
        if (ctx.on_gpu or "triton" not in name) and (compiled or not impl.compiled)
    ]


def _check(ctx: Context, op: Op, plan: dict) -> list[CheckRow]:
    """check_op on every impl; compiled impls (one compile per case) on fewer shapes and dtypes."""
    plain = [name for name, impl in op.impls.items() if not impl.compiled]
    compiled = [name for name, impl in op.impls.items() if impl.compiled]
    chosen = Selection(impls=plain, dtypes=plan["check_dtypes"], shapes=plan["check_shapes"], device=ctx.device)
    rows = check_op(op, chosen, show_progress=ctx.show_progress)
    if compiled and plan["compile_check_shapes"]:
        chosen = Selection(
            impls=compiled, dtypes=plan["compile_check_dtypes"], shapes=plan["compile_check_shapes"], device=ctx.device
        )
        rows += check_op(op, chosen, show_progress=ctx.show_progress)
    return rows


def _check_doc(doc: Doc, op: Op, rows: list[CheckRow]) -> list[CheckSummary]:
    """The correctness counts and table (one row per impl, dtype and option); returns the summaries."""
    summary = summarize_checks(rows)
    table = [
        [
            s.impl,
            s.dtype,
            *[s.field(k) for k in op.options],
            s.cases,
            g3(s.rel_err),
            g3(s.grad_rel_err),
            g3(op.tolerance.get(DTYPES[s.dtype])),
            "**FAIL**" if s.status is Verdict.FAIL else str(s.status),
            first_line(s.reason),
        ]
        for s in summary
    ]
    headers = [
        "impl",
        "dtype",
        *op.options,
        "cases",
        "max rel err",
        "max grad rel err",
        "tolerance",
        "status",
        "reason",
    ]
    passed = sum(r.status is Verdict.PASS for r in rows)
    failed = sum(r.status is Verdict.FAIL for r in rows)
    doc.text(
        f"**Correctness** against the float64 reference on fresh random inputs at odd shapes: {passed} cases passed, "
        f"{failed} failed, {len(rows) - passed - failed} unavailable here."
    )
    doc.table(headers, table)
    return summary


def _speed(op: Op) -> tuple[str, str, str, str]:
    """(rate field, its unit, % field, what the % is of) for the op's bound."""
    if op.bound == "compute":
        return "tflops", "TFLOP/s", "pct_peak", "the matmul ceiling"
    return "gbps", "GB/s", "pct_copy", "the copy ceiling"


def _cell(r: Row | None, op: Op) -> str:
    rate, unit, pct, _ = _speed(op)
    if r is None:
        return ""
    if r.error:
        return str(r.status) if r.status.on_purpose else "failed"
    share = r.field(pct)
    share_text = f" ({share:.0f}%{_past(r, pct)})" if share is not None else ""
    mark = NOISY_MARK if row_is_noisy(r) else ""
    return f"{ms(r.median_ms)}{mark} · {g3(r.field(rate), unit)}{share_text}"


def _past(r: Row, share: str) -> str:
    """ABOVE_MARK where the row's `share` (pct_copy, pct_copy_same, pct_peak) passes its ceiling, else ''."""
    return ABOVE_MARK if r.measured and share in past_ceilings(r) else ""


def past_legend(rows: Sequence[Row]) -> str:
    """What ABOVE_MARK means, for the ceilings the rows pass ('' where none does)."""
    notes = dict.fromkeys(CEILING_SHARES[share] for r in rows if r.measured for share in past_ceilings(r))
    return "\n".join(f"{ABOVE_MARK} over {ABOVE_CEILING_PCT:.0f}% of {note}" for note in notes)


def _notes(r: Row) -> str:
    """A row's note: its error's first line, else its warnings of a ceiling passed and the first two others."""
    if r.error:
        return first_line(r.error)
    past = tuple(CEILING_SHARES.values())
    return "; ".join([w for w in r.warnings if w.endswith(past)] + [w for w in r.warnings if not w.endswith(past)][:2])


def _bench_docs(ctx: Context, doc: Doc, op: Op, rows: list[Row], *, x: str, xlabel: str) -> None:
    """Per dtype (and option values) a table of time · rate against `x`; what could not run; every timing (folded);
    the plots of rate and time against `x`."""
    rate, unit, _pct, of = _speed(op)

    def variant_of(r: Row) -> tuple:
        panel = op.defaults.panel(r.case.shape) if op.defaults.panel else ""
        return (r.case.dtype, *[f"{k}={r.field(k)}" for k in op.options], r.case.pass_ or "forward", panel)

    def x_of(r: Row) -> object:
        return plot_point(op, r)[x]

    ok = [{**plot_point(op, r), "panel": " ".join(str(v) for v in variant_of(r) if v)} for r in rows if r.measured]

    variants = dict.fromkeys(variant_of(r) for r in rows)
    for variant in variants:
        mine = [r for r in rows if variant_of(r) == variant]
        xs = sorted({x_of(r) for r in mine})
        impls = list(dict.fromkeys(r.case.impl for r in mine))
        table = [
            [impl, *[_cell(next((r for r in mine if r.case.impl == impl and x_of(r) == v), None), op) for v in xs]]
            for impl in impls
        ]
        label = ", ".join(str(v) for v in variant if v)
        doc.table(
            [f"impl \\ {xlabel}", *[pow2(v) for v in xs]],
            table,
            caption=f"{op.name}, {label}: time · {unit} (% of {of}; ~ marks a noisy measurement)",
        )
        if any(row_is_noisy(r) for r in mine):
            doc.text(NOISY_LEGEND)
        if busy_line(mine):
            doc.text(f"**{busy_line(mine)}.**")
        if past_legend(mine):
            doc.text(past_legend(mine))
    notes = unavailable_notes(rows)
    if notes:
        doc.text("Not timed here:\n\n" + notes)
    _full_table(doc, op, rows)
    if ok:
        ceiling = _ceiling(ctx, op)
        doc.image(
            plot_metric(
                ok,
                ctx.plot(f"{op.name}_{rate}.png"),
                x=x,
                y=rate,
                ceiling=ceiling,
                ceiling_label=of.removeprefix("the "),
                xlabel=xlabel,
                ylabel=unit,
                title=op.name,
                panel="panel",
            ),
            f"{op.name}: {unit} against {xlabel}, with {of}.",
        )
        doc.image(
            plot_metric(
                ok,
                ctx.plot(f"{op.name}_time.png"),
                x=x,
                y="median_ms",
                xlabel=xlabel,
                ylabel="ms",
                logy=True,
                title=op.name,
                panel="panel",
            ),
            f"{op.name}: time against {xlabel} (log-log).",
        )


def _ceiling(ctx: Context, op: Op) -> float | Callable[[list[dict]], float | None] | None:
    """The copy ceiling (memory-bound), or per plot panel the matmul peak of its rows' dtype (compute-bound: fp32
    data against the fp32/tf32 rate, 16-bit data against bf16's)."""
    device = ctx.results.get("device", {})
    if op.bound == "memory":
        return device.get("copy_gbps")
    return lambda rows: peak_tflops(device, rows[0]["dtype"]) if rows else None


def _full_table(doc: Doc, op: Op, rows: list[Row], caption: str = "every timing", folded: bool = True) -> None:
    rate, unit, pct, _ = _speed(op)
    memory = op.bound == "memory"
    passes = len({r.case.pass_ for r in rows}) > 1  # a column only where forward and backward both ran
    table = [
        [
            r.case.impl,
            r.case.dtype,
            format_shape(r.case.shape),
            *([r.case.pass_] if passes else []),
            *[r.field(k) for k in op.options],
            ms(r.median_ms),
            ms(r.iqr_ms),
            g3(r.field(rate)),
            g3(r.field(pct)) + _past(r, pct),
            *([g3(r.pct_copy_same) + _past(r, "pct_copy_same")] if memory else []),
            g3(r.speedup),
            g3(r.rel_err),
            g3(r.compile_s),
            _notes(r),
        ]
        for r in rows
    ]
    headers = [
        "impl",
        "dtype",
        "shape",
        *(["pass"] if passes else []),
        *op.options,
        "median",
        "IQR",
        unit,
        "% copy" if memory else "% peak",
        *(["% copy same size"] if memory else []),
        f"× vs {op.defaults.baseline}",
        "rel err",
        "compile s",
        "note",
    ]
    doc.table(headers, table, caption=caption, folded=folded)


def _extra_table(doc: Doc, op: Op, rows: list[Row]) -> None:
    options = ", ".join(f"{k}={rows[0].field(k)}" for k in op.options) if rows else ""
    _full_table(doc, op, rows, caption=f"{op.name} at {options}", folded=False)


def unavailable_notes(rows: Sequence[Record]) -> str:
    """One bullet per impl that could not run, with its reason."""
    seen: dict[str, str] = {}
    for r in rows:
        impl = str(value(r, "impl"))
        if value(r, "error") and impl not in seen:
            seen[impl] = first_line(value(r, "error")).removeprefix("Unavailable: ")
    return "\n".join(f"- `{impl}`: {reason}" for impl, reason in seen.items())
