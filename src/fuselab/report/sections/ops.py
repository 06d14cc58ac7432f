"""The op sections: GELU and softmax, every impl checked against float64, then timed against the copy ceiling."""

from __future__ import annotations

import math
from collections.abc import Sequence

from fuselab.bench.results import NOISY_LEGEND, NOISY_MARK, plot_metric, row_is_noisy
from fuselab.ops.evaluate import DTYPES, bench_op, check_op, summarize_checks
from fuselab.ops.registry import Op, format_shape, get_op
from fuselab.report.doc import Doc
from fuselab.report.runner import Context
from fuselab.report.sections._common import first_line, g3, ms, pow2, slim


def gelu_section(ctx: Context, doc: Doc) -> dict:
    op = get_op("gelu")
    cfg = ctx.budget["gelu"]
    doc.text(
        "GELU five ways: `naive` (the tanh formula as separate PyTorch ops, one kernel and one trip through memory "
        "each), `torch` (F.gelu, one fused kernel), `compile` (the naive formula under torch.compile, compiled per "
        "shape), `triton` and `cuda` (hand-written fused kernels). Each moves 2 × numel × itemsize bytes at least, "
        "so GB/s is set against the copy ceiling. The tanh form is timed at every size, the exact (erf) form at one."
    )
    check = _check(ctx, op, cfg)
    summary = _check_doc(doc, op, check)
    impls = _bench_impls(ctx, op)
    timing = ctx.budget["timing"]
    dtypes = [DTYPES[d] for d in cfg["bench_dtypes"]]
    rows = bench_op(
        op,
        impls=impls,
        dtypes=dtypes,
        shapes=cfg["bench_shapes"],
        options={"approximate": "tanh"},
        device=ctx.device,
        out=ctx.log("gelu", "bench"),
        timing=timing,
        show_progress=ctx.show_progress,
    )
    rows += bench_op(
        op,
        impls=impls,
        dtypes=dtypes,
        shapes=[cfg["erf_shape"]],
        options={"approximate": "none"},
        device=ctx.device,
        out=ctx.log("gelu", "bench_erf"),
        timing=timing,
        show_progress=ctx.show_progress,
    )
    for r in rows:
        r.setdefault("numel", math.prod(r["shape"]))
    if not ctx.on_gpu:
        doc.text("On the CPU, Triton runs under its interpreter: it is checked for correctness above, never timed.")
    tanh = [r for r in rows if r.get("approximate") == "tanh"]
    _bench_docs(ctx, doc, op, tanh, x="numel", xlabel="elements", title="GELU (tanh)")
    erf = [r for r in rows if r.get("approximate") == "none"]
    if erf:
        table = [
            [
                r["impl"],
                r["dtype"],
                ms(r.get("median_ms")),
                g3(r.get("gbps")),
                g3(r.get("pct_copy")),
                g3(r.get("speedup_vs_torch")),
                first_line(r.get("error")),
            ]
            for r in erf
        ]
        doc.table(
            ["impl", "dtype", "median", "GB/s", "% copy", "× vs torch", "note"],
            table,
            caption=f"GELU exact (erf) form at {pow2(erf[0]['numel'])} elements",
        )
    return {
        "check": summary,
        "check_failed": sum(r["status"] == "FAIL" for r in check),
        "bench": [slim(r) for r in rows],
    }


def softmax_section(ctx: Context, doc: Doc) -> dict:
    op = get_op("softmax")
    cfg = ctx.budget["softmax"]
    doc.text(
        "Softmax over the last dimension, all ways: `naive` (max, subtract, exp, sum, divide as separate ops), "
        "`torch` (torch.softmax), `compile` (the naive version under torch.compile, per shape), `triton` (one row "
        "per program while a row fits, a looped kernel past that) and `cuda`. The tensor keeps "
        f"{pow2(cfg['bench_numel'])} elements while the row width changes (rows = elements / width)."
    )
    check = _check(ctx, op, cfg)
    summary = _check_doc(doc, op, check)
    shapes = [(cfg["bench_numel"] // w, w) for w in cfg["bench_widths"]]
    rows = bench_op(
        op,
        impls=_bench_impls(ctx, op),
        dtypes=[DTYPES[d] for d in cfg["bench_dtypes"]],
        shapes=shapes,
        device=ctx.device,
        out=ctx.log("softmax", "bench"),
        timing=ctx.budget["timing"],
        show_progress=ctx.show_progress,
    )
    for r in rows:
        r["width"] = r["shape"][-1]
        r.setdefault("numel", math.prod(r["shape"]))
    if not ctx.on_gpu:
        doc.text("On the CPU, Triton runs under its interpreter: it is checked for correctness above, never timed.")
    _bench_docs(ctx, doc, op, rows, x="width", xlabel="row width", title="softmax")
    return {
        "check": summary,
        "check_failed": sum(r["status"] == "FAIL" for r in check),
        "bench": [slim(r) for r in rows],
    }


def _bench_impls(ctx: Context, op: Op) -> list[str]:
    """Every impl on a GPU; on the CPU all but Triton (its interpreter is for correctness, not speed)."""
    return [name for name in op.impls if ctx.on_gpu or "triton" not in name]


def _check(ctx: Context, op: Op, cfg: dict) -> list[dict]:
    """check_op on every impl; compiled impls (one compile per case) on fewer shapes and dtypes."""
    plain = [name for name, impl in op.impls.items() if not impl.compiled]
    compiled = [name for name, impl in op.impls.items() if impl.compiled]
    rows = check_op(
        op,
        impls=plain,
        dtypes=[DTYPES[d] for d in cfg["check_dtypes"]],
        shapes=cfg["check_shapes"],
        device=ctx.device,
        show_progress=ctx.show_progress,
    )
    if compiled and cfg["compile_check_shapes"]:
        rows += check_op(
            op,
            impls=compiled,
            dtypes=[DTYPES[d] for d in cfg["compile_check_dtypes"]],
            shapes=cfg["compile_check_shapes"],
            device=ctx.device,
            show_progress=ctx.show_progress,
        )
    return rows


def _check_doc(doc: Doc, op: Op, rows: list[dict]) -> list[dict]:
    """The correctness counts and table (one row per impl, dtype and option); returns the summary rows."""
    summary = summarize_checks(rows)
    table = [
        [
            s["impl"],
            s["dtype"],
            *[s.get(k) for k in op.options],
            s["cases"],
            g3(s["rel_err"]),
            g3(s["grad_rel_err"]),
            g3(op.tolerance[DTYPES[s["dtype"]]]),
            {"pass": "pass", "FAIL": "**FAIL**"}.get(s["status"], s["status"]),
            first_line(s.get("reason")),
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
    passed = sum(r["status"] == "pass" for r in rows)
    failed = sum(r["status"] == "FAIL" for r in rows)
    doc.text(
        f"**Correctness** against the float64 reference on fresh random inputs at odd shapes: {passed} cases passed, "
        f"{failed} failed, {len(rows) - passed - failed} unavailable here."
    )
    doc.table(headers, table)
    return summary


def _bench_docs(ctx: Context, doc: Doc, op: Op, rows: list[dict], *, x: str, xlabel: str, title: str) -> None:
    """Per dtype a table of time · GB/s against `x`; then what could not run, every timing (folded) and the plots."""
    ok = [r for r in rows if not r.get("error")]
    copy = ctx.results.get("device", {}).get("copy_gbps")
    for dtype in dict.fromkeys(r["dtype"] for r in rows):
        mine = [r for r in rows if r["dtype"] == dtype]
        xs = sorted({r[x] for r in mine})
        impls = list(dict.fromkeys(r["impl"] for r in mine))
        table = []
        for impl in impls:
            cells = [impl]
            for v in xs:
                r = next((r for r in mine if r["impl"] == impl and r[x] == v), None)
                if r is None:
                    cells.append("")
                elif r.get("error"):
                    status = r.get("status") or ("unavailable" if "Unavailable" in str(r["error"]) else "failed")
                    cells.append(status if status in ("unavailable", "skipped", "refused") else "failed")
                else:
                    pct = f" ({r['pct_copy']:.0f}%)" if r.get("pct_copy") is not None else ""
                    mark = NOISY_MARK if row_is_noisy(r) else ""
                    cells.append(f"{ms(r['median_ms'])}{mark} · {g3(r['gbps'], 'GB/s')}{pct}")
            table.append(cells)
        doc.table(
            [f"impl \\ {xlabel}", *[pow2(v) for v in xs]],
            table,
            caption=f"{title}, {dtype}: time · GB/s (% of the copy ceiling)",
        )
        if any(row_is_noisy(r) for r in mine):
            doc.text(NOISY_LEGEND)
    notes = unavailable_notes(rows)
    if notes:
        doc.text("Not timed here:\n\n" + notes)
    full = [
        [
            r["impl"],
            r["dtype"],
            format_shape(tuple(r["shape"])),
            *[r.get(k) for k in op.options],
            ms(r.get("median_ms")),
            ms(r.get("iqr_ms")),
            g3(r.get("gbps")),
            g3(r.get("pct_copy")),
            g3(r.get("pct_copy_same")),
            g3(r.get(f"speedup_vs_{op.baseline}")),
            g3(r.get("rel_err")),
            g3(r.get("compile_s")),
            first_line(r.get("error")) or "; ".join(r.get("compile_flags") or []),
        ]
        for r in rows
    ]
    doc.table(
        [
            "impl",
            "dtype",
            "shape",
            *op.options,
            "median",
            "IQR",
            "GB/s",
            "% copy",
            "% copy same size",
            f"× vs {op.baseline}",
            "rel err",
            "compile s",
            "note",
        ],
        full,
        caption="every timing",
        folded=True,
    )
    if ok:
        doc.image(
            plot_metric(
                ok,
                ctx.plot(f"{op.name}_gbps.png"),
                x=x,
                y="gbps",
                ceiling=copy,
                xlabel=xlabel,
                ylabel="GB/s",
                title=title,
            ),
            f"{title}: GB/s against {xlabel}, with the copy ceiling.",
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
                title=title,
            ),
            f"{title}: time against {xlabel} (log-log).",
        )


def unavailable_notes(rows: Sequence[dict]) -> str:
    """One bullet per impl that could not run, with its reason."""
    seen: dict[str, str] = {}
    for r in rows:
        if r.get("error") and r["impl"] not in seen:
            seen[r["impl"]] = first_line(r["error"]).removeprefix("Unavailable: ")
    return "\n".join(f"- `{impl}`: {reason}" for impl, reason in seen.items())
