"""The report's sections, in the lecture's order. Each is `fn(ctx, doc) -> results` (see fuselab.report.runner).

Measuring is done by the library (fuselab.bench, fuselab.ops.evaluate, fuselab.studies, fuselab.profile); a
section picks the sizes of its mode (fuselab.report.budgets), runs, writes plots, and says what it shows.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from fuselab.bench.ceilings import get_ceilings
from fuselab.bench.results import plot_metric
from fuselab.ops.evaluate import DTYPES, bench_op, check_op, summarize_checks
from fuselab.ops.registry import Op, format_shape, get_op
from fuselab.report.doc import Doc
from fuselab.report.runner import Context, Section
from fuselab.studies import claims as claims_mod
from fuselab.studies import pitfalls, roofline, scaling

# ------------------------------------------------------------------------------------------------ formatting


def g3(value: float | None, unit: str = "") -> str:
    """Three significant digits (thousands plain), with a unit; empty for None."""
    if value is None:
        return ""
    text = f"{value:.0f}" if abs(value) >= 1000 else f"{value:.3g}"
    return f"{text} {unit}".strip()


def ms(value: float | None) -> str:
    """A time given in ms, shown in µs below 1 ms."""
    if value is None:
        return ""
    return f"{value * 1e3:.3g} µs" if value < 1 else f"{value:.4g} ms"


def pow2(n: int) -> str:
    """2^k for powers of two (from 2^10), else the number."""
    return f"2^{n.bit_length() - 1}" if n >= 1024 and n & (n - 1) == 0 else str(n)


def first_line(text: object) -> str:
    """The first line of a message, without the exception's module path."""
    if not text:
        return ""
    line = str(text).strip().splitlines()[0][:200]
    return line.removeprefix("fuselab.ops.evaluate.")


def unavailable_notes(rows: Sequence[dict]) -> str:
    """One bullet per impl that could not run, with its reason."""
    seen: dict[str, str] = {}
    for r in rows:
        if r.get("error") and r["impl"] not in seen:
            seen[r["impl"]] = first_line(r["error"]).removeprefix("Unavailable: ")
    return "\n".join(f"- `{impl}`: {reason}" for impl, reason in seen.items())


# ------------------------------------------------------------------------------------------------ device


def device_section(ctx: Context, doc: Doc) -> dict:
    c = get_ceilings(ctx.device, refresh=ctx.budget["ceilings_refresh"])
    doc.text(
        "Every GB/s and TFLOP/s below is set against these ceilings, measured on this device (not the datasheet): "
        "a device-to-device copy (bytes read + written), large square matmuls per dtype, and the cost of "
        "launching a tiny kernel."
    )
    rows = [["copy bandwidth", f"{c['copy_gbps']:.0f} GB/s"]]
    rows += [[f"matmul {k} ({c['matmul_n']}³)", f"{v:.3g} TFLOP/s"] for k, v in c["matmul_tflops"].items()]
    rows += [["launch (host)", f"{c['launch_us']:.2f} µs"], ["tiny kernel (device)", f"{c['tiny_kernel_us']:.2f} µs"]]
    env = c["env"]
    for key in ("gpu", "cpu", "sm_count", "l2_bytes", "memory_bytes", "driver", "torch", "triton", "cuda"):
        if env.get(key) is not None:
            rows.append([key, str(env[key])])
    doc.table(["ceiling", "measured"], rows)
    ridge = {k: roofline.ridge_point(c["copy_gbps"], v) for k, v in c["matmul_tflops"].items()}
    doc.text(
        "Ridge points (FLOP per byte where compute, not memory, becomes the limit): "
        + ", ".join(f"{k} {v:.3g}" for k, v in ridge.items())
        + ". A kernel doing fewer FLOPs per byte moved than this is memory-bound on this device."
    )
    keys = ("copy_gbps", "matmul_tflops", "matmul_n", "launch_us", "tiny_kernel_us", "env", "quick")
    return {**{k: c.get(k) for k in keys}, "ridge_ai": ridge}


# ------------------------------------------------------------------------------------------------ pitfalls


def _pitfall_maker(case: dict, device: str) -> tuple[str, pitfalls.Maker]:
    dtype = DTYPES[case["dtype"]]
    short = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}[case["dtype"]]
    if case["kind"] == "matmul":
        n = case["n"]
        return f"matmul {n}³ {short}", pitfalls.matmul_maker(n, dtype, device)
    shape = tuple(case["shape"])
    what = {"naive": "naive", "torch": "F.gelu", "compile": "torch.compile"}.get(case["impl"], case["impl"])
    label = f"{case['op']} {what} {format_shape(tuple(pow2(s) for s in shape))} {short}"
    return label, pitfalls.op_maker(case["op"], case["impl"], shape, dtype, device)


def pitfalls_section(ctx: Context, doc: Doc) -> dict:
    cases = []
    for case in ctx.budget["pitfalls"]:
        label, make = _pitfall_maker(case, ctx.device)
        try:
            cases.append(pitfalls.time_three_ways(make, label=label, device=ctx.device, timing=ctx.budget["timing"]))
        except Exception as exc:  # one case failing (e.g. no compiler for torch.compile) leaves the others
            cases.append({"label": label, "error": f"{type(exc).__name__}: {first_line(exc)}"})
    done = [c for c in cases if not c.get("error")]
    if not done:
        raise RuntimeError("every pitfall case failed: " + "; ".join(c["error"] for c in cases))
    doc.text(
        "One kernel timed three ways. **No warm-up**: the mean of the first calls, as a loop without warm-up "
        "reports it; the first call pays one-time costs (compilation, library set-up, clocks still ramping). "
        "**No synchronize**: a host clock read around the call, without waiting for the device; on a GPU it times "
        "only the launch. **Correct**: warm-up, synchronize, CUDA events (or a synced clock on the CPU), median of "
        "many runs."
    )
    rows = []
    for c in cases:
        if c.get("error"):
            rows.append([c["label"], "failed: " + c["error"], "", "", "", "", "", ""])
            continue
        rows.append(
            [
                c["label"],
                ms(c["first_call_ms"]),
                ms(c["no_warmup_ms"]),
                ms(c["no_sync_ms"]),
                f"{ms(c['correct_ms'])} ± {ms(c['correct_iqr_ms'])}",
                f"{c['first_call_ratio']:.3g}×",
                f"{c['no_warmup_ratio']:.3g}×",
                f"{c['no_sync_underreport']:.3g}×" if c["no_sync_underreport"] else "",
            ]
        )
    headers = [
        "kernel",
        "first call",
        "no warm-up (mean)",
        "no sync",
        "correct (median ± IQR)",
        "first / correct",
        "no warm-up / correct",
        "correct / no sync",
    ]
    doc.table(headers, rows)
    if not ctx.on_gpu:
        doc.text(
            "On the CPU every op runs to completion before the call returns, so timing without synchronize reads "
            "the right time here: that pitfall exists only on an asynchronous device such as a GPU."
        )
    path = _pitfall_plot(done, ctx.plot("pitfalls.png"))
    doc.image(path, "The same kernel timed three ways (log scale): the wrong ways err by orders of magnitude.")
    return {"cases": cases}


def _pitfall_plot(cases: list[dict], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = [
        ("first_call_ms", "first call"),
        ("no_warmup_ms", "no warm-up (mean)"),
        ("no_sync_ms", "no sync"),
        ("correct_ms", "correct"),
    ]
    fig, ax = plt.subplots(figsize=(max(6, 2.6 * len(cases)), 4.2))
    width = 0.8 / len(kinds)
    for i, (key, label) in enumerate(kinds):
        xs = [j + (i - 1.5) * width for j in range(len(cases))]
        ax.bar(xs, [c[key] for c in cases], width, label=label)
    ax.set_xticks(range(len(cases)), [c["label"] for c in cases], fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("ms per call")
    ax.set_title("benchmarking pitfalls")
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# ------------------------------------------------------------------------------------------------ matmul


def matmul_section(ctx: Context, doc: Doc) -> dict:
    b = ctx.budget
    rows = scaling.matmul_scaling(
        b["matmul_sizes"],
        dtypes=b["matmul_dtypes"],
        device=ctx.device,
        timing=b["timing"],
        out=ctx.log("matmul", "sweep"),
        show_progress=ctx.show_progress,
    )
    ok = [r for r in rows if not r.get("error")]
    peaks = ctx.results.get("device", {}).get("matmul_tflops", {})
    regimes = {}
    for dtype in b["matmul_dtypes"]:
        mine = sorted((r for r in ok if r["dtype"] == dtype), key=lambda r: r["n"])
        if len(mine) >= 3:
            regimes[dtype] = scaling.regimes([r["n"] for r in mine], [r["median_ms"] for r in mine])
    if not regimes:
        raise RuntimeError("too few matmul sizes finished to find the regimes")
    doc.text(
        "C = A @ B for square n × n matrices (2n³ FLOPs). Small matmuls cost about the same whatever their size: "
        "the launch and a device mostly idle dominate. Large ones are compute-bound: time grows as n³, and "
        "TFLOP/s approach the ceiling. The local exponent is the log-log slope of time to the next size "
        "(0 = flat, 3 = cubic)."
    )
    table = []
    for dtype in b["matmul_dtypes"]:
        short = _short(dtype)
        peak = peaks.get(short)
        sizes = sorted(r["n"] for r in ok if r["dtype"] == dtype)
        slope_at = dict(zip(sizes, regimes.get(dtype, {}).get("local_exponents", []), strict=False))
        for r in sorted((r for r in rows if r["dtype"] == dtype), key=lambda r: r["n"]):
            if r.get("error"):
                table.append([r["n"], dtype, "failed: " + first_line(r["error"]), "", "", ""])
                continue
            table.append(
                [
                    r["n"],
                    dtype,
                    ms(r["median_ms"]),
                    g3(r["tflops"]),
                    f"{100 * r['tflops'] / peak:.1f}%" if peak else "",
                    f"{slope_at[r['n']]:.2f}" if r["n"] in slope_at else "",
                ]
            )
    doc.table(["n", "dtype", "time", "TFLOP/s", "% of matmul ceiling", "local exponent"], table)
    lines = []
    for dtype, reg in regimes.items():
        cubic = f"from n = {reg['cubic_from']}" if reg["cubic_from"] else "not reached at these sizes"
        lines.append(
            f"- {dtype}: time stays within 2× of the smallest size's up to n = {reg['flat_until']} (slope "
            f"{reg['small_exponent']:.2f} over the three smallest sizes); cubic growth (slope ≥ 2.5) {cubic} "
            f"(slope {reg['large_exponent']:.2f} over the three largest)."
        )
    doc.text("\n".join(lines))
    series = {_short(d): [(r["n"], r["median_ms"]) for r in ok if r["dtype"] == d] for d in b["matmul_dtypes"]}
    guides = {}
    for name, pts in series.items():
        if pts:
            n_max, t_max = max(pts)
            guides[f"n³ through {name}'s largest"] = [(n, t_max * (n / n_max) ** 3) for n, _ in sorted(pts)]
    doc.image(
        line_plot(
            {**series, **guides},
            ctx.plot("matmul_time.png"),
            xlabel="n",
            ylabel="ms",
            logy=True,
            title="matmul time against size",
            dashed=set(guides),
        ),
        "Matmul time against n (log-log): flat, then parallel to the n³ guide.",
    )
    tf = {_short(d): [(r["n"], r["tflops"]) for r in ok if r["dtype"] == d] for d in b["matmul_dtypes"]}
    hlines = {f"{k} ceiling": v for k, v in peaks.items() if k in tf}
    doc.image(
        line_plot(
            tf,
            ctx.plot("matmul_tflops.png"),
            xlabel="n",
            ylabel="TFLOP/s",
            logy=True,
            hlines=hlines,
            title="matmul TFLOP/s against size",
        ),
        "TFLOP/s against n, with the measured matmul ceilings.",
    )
    return {"rows": [_slim(r) for r in rows], "regimes": regimes}


def _short(dtype: str) -> str:
    return {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(dtype, dtype)


_KEEP = (
    "study",
    "axis",
    "value",
    "layers",
    "steps",
    "batch",
    "dim",
    "op",
    "impl",
    "dtype",
    "shape",
    "approximate",
    "n",
    "numel",
    "width",
    "median_ms",
    "iqr_ms",
    "min_ms",
    "reps",
    "mode",
    "flops",
    "bytes",
    "ai",
    "tflops",
    "gbps",
    "pct_copy",
    "speedup_vs_torch",
    "rel_err",
    "compile_s",
    "compile_flags",
    "warnings",
    "error",
)


def _slim(row: dict) -> dict:
    """A results row without the bulky fields (the JSON-lines logs keep everything)."""
    out = {k: row[k] for k in _KEEP if k in row}
    if row.get("study") != "matmul":
        out.pop("n", None)  # in bench rows `n` counts the repetitions
        if "n" in row:
            out["reps"] = row["n"]
    return out


def line_plot(
    series: dict[str, list[tuple[float, float]]],
    path: Path,
    *,
    xlabel: str,
    ylabel: str,
    title: str = "",
    logx: bool = True,
    logy: bool = False,
    hlines: dict[str, float] | None = None,
    dashed: set[str] | None = None,
) -> Path:
    """One line per series of (x, y) points; hlines: labelled horizontal lines (ceilings)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for label, pts in series.items():
        if not pts:
            continue
        pts = sorted(pts)
        style = {"linestyle": "--", "color": "grey", "linewidth": 1} if label in (dashed or set()) else {"marker": "o"}
        ax.plot([p[0] for p in pts], [p[1] for p in pts], label=label, **style)
    for i, (label, y) in enumerate((hlines or {}).items()):
        ax.axhline(y, color="black", linestyle=[":", "-.", "--"][i % 3], linewidth=1, label=label)
    if logx:
        ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# ------------------------------------------------------------------------------------------------ MLP


def mlp_section(ctx: Context, doc: Doc) -> dict:
    b = ctx.budget
    base = b["mlp_base"]
    rows = scaling.mlp_scaling(
        base,
        b["mlp_sweeps"],
        device=ctx.device,
        timing=b["timing"],
        out=ctx.log("mlp", "sweep"),
        show_progress=ctx.show_progress,
    )
    fits = scaling.mlp_fits(rows)
    if not fits:
        raise RuntimeError("no MLP sweep finished with two or more points")
    doc.text(
        f"An MLP of `layers` × (Linear(dim, dim) + GELU), run for `steps` forward + backward passes on a batch of "
        f"`batch` × `dim`, one axis varied at a time around layers = {base['layers']}, steps = {base['steps']}, "
        f"batch = {base['batch']}, dim = {base['dim']}. A least-squares line is fitted to time against each axis; "
        "R² says how linear it is, and the log-log exponent what the line hides (1 = linear; 2 for dim at "
        "full use, since each layer is dim² weights; below 1 while the device is not yet full)."
    )
    table = []
    for axis in scaling.MLP_AXES:
        pts = sorted((r["value"], r["median_ms"]) for r in rows if r.get("axis") == axis and not r.get("error"))
        fit = fits.get(axis)
        table.append(
            [
                axis,
                ", ".join(str(v) for v, _ in pts),
                ", ".join(ms(t) for _, t in pts),
                f"{fit['slope']:.4g} ms per unit" if fit else "",
                f"{fit['intercept']:.4g} ms" if fit else "",
                f"{fit['r2']:.4f}" if fit else "",
                f"{fit['exponent']:.2f}" if fit else "",
            ]
        )
    doc.table(["axis", "values", "time", "slope", "intercept", "R²", "log-log exponent"], table)
    failed = [r for r in rows if r.get("error")]
    if failed:
        doc.text(
            f"{len(failed)} point(s) failed: "
            + "; ".join(f"{r['axis']}={r['value']}: {first_line(r['error'])}" for r in failed)
        )
    doc.image(_mlp_plot(rows, fits, ctx.plot("mlp.png")), "MLP time against each axis, with the fitted line.")
    return {"base": base, "rows": [_slim(r) for r in rows], "fits": fits}


def _mlp_plot(rows: list[dict], fits: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(16, 3.8))
    for ax, axis in zip(axes, scaling.MLP_AXES, strict=True):
        pts = sorted((r["value"], r["median_ms"]) for r in rows if r.get("axis") == axis and not r.get("error"))
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o", label="measured")
        fit = fits.get(axis)
        if fit and pts:
            xs = [pts[0][0], pts[-1][0]]
            ax.plot(
                xs,
                [fit["intercept"] + fit["slope"] * x for x in xs],
                "-",
                color="black",
                linewidth=1,
                label=f"fit, R² = {fit['r2']:.3f}",
            )
        ax.set_xlabel(axis)
        ax.set_ylabel("ms")
        ax.set_title(f"time vs {axis}" + (f" (exp. {fit['exponent']:.2f})" if fit else ""))
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# ------------------------------------------------------------------------------------------------ ops


def _check(ctx: Context, op: Op, cfg: dict) -> list[dict]:
    """check_op on every impl; compiled impls (one compile per case) on fewer shapes and dtypes."""
    plain = [name for name, impl in op.impls.items() if not impl.compiled]
    compiled = [name for name, impl in op.impls.items() if impl.compiled]
    shapes = cfg["check_shapes"]
    rows = check_op(
        op,
        impls=plain,
        dtypes=[DTYPES[d] for d in cfg["check_dtypes"]],
        shapes=shapes,
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
                    cells.append("unavailable" if "Unavailable" in str(r["error"]) else "failed")
                else:
                    pct = f" ({r['pct_copy']:.0f}%)" if r.get("pct_copy") is not None else ""
                    cells.append(f"{ms(r['median_ms'])} · {g3(r['gbps'], 'GB/s')}{pct}")
            table.append(cells)
        doc.table(
            [f"impl \\ {xlabel}", *[pow2(v) for v in xs]],
            table,
            caption=f"{title}, {dtype}: time · GB/s (% of the copy ceiling)",
        )
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
        "bench": [_slim(r) for r in rows],
    }


def _bench_impls(ctx: Context, op: Op) -> list[str]:
    """Every impl on a GPU; on the CPU all but Triton (its interpreter is for correctness, not speed)."""
    return [name for name in op.impls if ctx.on_gpu or "triton" not in name]


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
        "bench": [_slim(r) for r in rows],
    }


# ------------------------------------------------------------------------------------------------ profiling


def gzip_traces(folder: Path) -> None:
    """Compress the Chrome traces (trace*.json) in `folder` to .json.gz (Perfetto opens them as they are)."""
    import gzip
    import shutil

    for path in folder.glob("trace*.json"):
        with path.open("rb") as src, gzip.open(path.with_name(path.name + ".gz"), "wb") as dst:
            shutil.copyfileobj(src, dst)
        path.unlink()


def profile_section(ctx: Context, doc: Doc) -> dict:
    from fuselab.profile import build_table, impl_callable, profile_callable
    from fuselab.profile.cases import CASES
    from fuselab.profile.table import format_us

    cfg = ctx.budget["profile"]
    names = cfg["cases"] or list(CASES)
    runs: list[tuple[str, str, Callable[[], object]]] = [(n, CASES[n].doc, CASES[n].make(ctx.device)) for n in names]
    for op_name, impl, shape in cfg["impls"]:
        op = get_op(op_name)
        fn = impl_callable(op, impl, shape, torch.float32, ctx.device)
        runs.append((f"{op_name}_{impl}", f"{op_name} {impl}, {pow2(math.prod(shape))} elements, float32", fn))
    doc.text(
        "torch.profiler on the lecture's cases: each operator the code called, and below it (└) the GPU kernels it "
        "launched, with their total time over the profiled calls. Traces (open in https://ui.perfetto.dev) are in "
        "`traces/`." + ("" if ctx.on_gpu else " Without a GPU the rows are CPU operators and their CPU time.")
    )
    cases, facts = {}, {"gpu": ctx.on_gpu}
    for name, what, fn in runs:
        try:
            result = profile_callable(
                fn,
                label=name,
                warmup=cfg["warmup"],
                iters=cfg["iters"],
                out_dir=ctx.out / "traces" / name,
                cuda=ctx.on_gpu,
            )
        except Exception as exc:  # one case failing leaves the others
            cases[name] = {"error": f"{type(exc).__name__}: {first_line(exc)}"}
            doc.text(f"### {name}\n\n{what}: **failed**: `{cases[name]['error']}`")
            continue
        table = build_table(result.trace, title=name)
        gzip_traces(result.trace_path.parent)
        kernels = sorted({k.name for o in table.ops for k in o.kernels})
        cpu_ops = sorted({e.name for e in result.trace.ops})
        cases[name] = {
            "doc": what,
            "iters": cfg["iters"],
            "kernels": kernels,
            "distinct_kernels": len(kernels),
            "cpu_ops": cpu_ops,
            "table": table.to_json(),
        }
        rows = []
        for o in table.ops[:12]:
            label = o.name if o.kind == "op" else f"[range] {o.name}"
            rows.append(
                [
                    f"**{label}**",
                    o.calls,
                    format_us(o.gpu_us) if o.kernels else "",
                    format_us(o.cpu_us),
                    f"{100 * table.share(o):.1f}",
                ]
            )
            rows += [
                [f"└ `{k.name}`", k.calls, format_us(k.gpu_us), "", f"{100 * table.share(k):.1f}"]
                for k in o.kernels[:8]
            ]
        doc.text(
            f"### {name}\n\n{what}. "
            + (
                f"{len(kernels)} distinct kernel(s)."
                if ctx.on_gpu
                else f"{len(cpu_ops)} distinct operator(s), nested ones included."
            )
        )
        doc.table(["operator / └ kernel", "calls", "GPU total", "CPU total", "%"], rows)
    if all("error" in c for c in cases.values()):
        raise RuntimeError("every profiling case failed")
    count = "distinct_kernels" if ctx.on_gpu else None

    def n_of(case: str) -> int | None:
        c = cases.get(case, {})
        if "error" in c or not c:
            return None
        return c[count] if count else len(c["cpu_ops"])

    facts.update(
        cdist_kernels=n_of("cdist"),
        gelu_add_kernels=n_of("gelu_add"),
        softmax_add_kernels=n_of("softmax_add"),
        naive_gelu_kernels=n_of("gelu_naive"),
        matmul_kernels={
            k.removeprefix("matmul"): ", ".join(cases[k]["kernels"] or ["(CPU: no kernels)"])
            for k in ("matmul128", "matmul2048")
            if k in cases and "error" not in cases[k]
        },
    )
    return {"cases": cases, "facts": facts}


def runahead_section(ctx: Context, doc: Doc) -> dict:
    from fuselab.profile.runahead import MLPConfig, run_runahead

    cfg = ctx.budget["runahead"]
    study = run_runahead(
        MLPConfig(steps=cfg["steps"], layers=cfg["layers"], device=ctx.device), ctx.out / "traces" / "runahead"
    )
    doc.text(
        "A training loop of an MLP, run twice: plainly, and printing the loss (`loss.item()`) every step. CUDA calls "
        "are asynchronous, so in the plain loop the CPU queues kernels and runs ahead of the GPU; reading the loss "
        "makes it wait for the GPU every step. In the timelines, grey lines join each launch (CPU) to its kernel "
        "(GPU): the further they lean right, the further ahead the CPU is. Red marks are synchronizations."
    )
    gzip_traces(ctx.out / "traces" / "runahead")
    doc.code(study.summary(), caption="run-ahead summary")
    plain, printed = study.runs[0], study.runs[1]
    for run in study.runs:
        dst = ctx.plot(f"runahead_{run.name}.png")
        dst.write_bytes(run.timeline_path.read_bytes())
        doc.image(dst, f"{run.name}: {run.wall_ms:.1f} ms wall for {study.config.steps} steps")
    facts = {
        "gpu": plain.analysis.has_gpu,
        "lead_ms": plain.analysis.lag_ms_max,
        "steps_ahead_max": plain.analysis.steps_ahead_max,
        "sync_wait_ms": printed.analysis.sync_wait_ms,
        "wall_plain_ms": plain.wall_ms,
        "wall_print_ms": printed.wall_ms,
        "added_syncs": study.added_syncs,
    }
    summary = study.to_json()
    for run in summary["runs"]:  # paths inside the report folder, traces compressed above
        run["trace"] = f"traces/runahead/{Path(run['trace']).name}.gz"
        run["timeline"] = f"plots/runahead_{run['name']}.png"
    return {"study": summary, "facts": facts}


def inspect_section(ctx: Context, doc: Doc) -> dict:
    from fuselab.profile.inspect import inspect_impl

    doc.text(
        "What the fused kernels compile to: registers per thread, spills, shared memory, and the widest global "
        "load and store (`ld.global.v4.b32` moves 16 bytes per thread: vectorized; `.b32` only 4)."
        + ("" if ctx.on_gpu else " Without a GPU the Triton kernels are compiled for sm_90 as the JIT would.")
    )
    items = []
    for op_name, impl in ctx.budget["inspect"]:
        try:
            inspection = inspect_impl(op_name, impl, dtype=torch.float32)
        except Exception as exc:  # one failing (no nvcc, say) leaves the others
            error = f"{type(exc).__name__}: {exc}".strip()
            items.append({"op": op_name, "impl": impl, "error": error[:3000]})
            doc.code(error, caption=f"{op_name} / {impl}: could not inspect", folded=True)
            continue
        inspection.write(ctx.out / "traces" / "inspect" / f"{op_name}_{impl}")
        items.append({**inspection.to_json(), "summary": inspection.summary()})
        doc.code(inspection.summary(), caption=f"{op_name} / {impl}")
    if all("error" in i for i in items):
        raise RuntimeError("no kernel could be inspected: " + "; ".join(i["error"] for i in items))
    return {"items": items}


# ------------------------------------------------------------------------------------------------ derived


def roofline_points(results: dict[str, dict]) -> list[dict]:
    """The measured kernels as roofline points: matmuls at every size, GELU (tanh) and softmax at every timing."""
    points = []
    for r in results.get("matmul", {}).get("rows", []):
        if not r.get("error"):
            points.append(
                {
                    "label": f"matmul {r['n']} {_short(r['dtype'])}",
                    "group": f"matmul {_short(r['dtype'])}",
                    "family": "matmul",
                    "kind": "matmul",
                    "dtype": r["dtype"],
                    "flops": r["flops"],
                    "bytes": r["bytes"],
                    "median_ms": r["median_ms"],
                }
            )
    for name in ("gelu", "softmax"):
        if name not in results:
            continue
        op = get_op(name)
        for r in results[name].get("bench", []):
            if r.get("error") or r.get("approximate", "tanh") != "tanh":
                continue
            points.append(
                {
                    "label": f"{name} {r['impl']} {_short(r['dtype'])} {format_shape(tuple(r['shape']))}",
                    "group": f"{name} {r['impl']} {_short(r['dtype'])}",
                    "family": name,
                    "kind": "elementwise",
                    "dtype": r["dtype"],
                    "flops": op.flops(tuple(r["shape"])),
                    "bytes": r["bytes"],
                    "median_ms": r["median_ms"],
                }
            )
    return points


def roofline_section(ctx: Context, doc: Doc) -> dict:
    device = ctx.need("device")
    points = roofline_points(ctx.results)
    if not points:
        raise LookupError("no measured kernel to place: the matmul, GELU and softmax sections did not finish")
    copy, peaks = device["copy_gbps"], device["matmul_tflops"]
    placed = roofline.place_all(points, copy, peaks)
    doc.text(
        f"Each measured kernel at its arithmetic intensity (FLOPs per byte it must move) against the roofs measured "
        f"here: memory {copy:.0f} GB/s, compute "
        + ", ".join(f"{k} {v:.3g} TFLOP/s" for k, v in peaks.items())
        + ". Left of a ridge point a kernel is memory-bound (GELU, softmax: a handful of FLOPs per byte); right of "
        "it compute-bound (large matmuls). Non-matmul kernels are held against the fp32 rate. % of roof is achieved "
        "TFLOP/s over the roof at that intensity."
    )
    doc.image(
        roofline.plot_roofline(placed, copy, peaks, ctx.plot("roofline.png")),
        "Roofline: measured kernels against the measured ceilings (log-log).",
    )
    shown = []
    for group in dict.fromkeys(p["group"] for p in placed):
        mine = sorted((p for p in placed if p["group"] == group), key=lambda p: p["flops"])
        shown += [mine[0], mine[-1]] if len(mine) > 1 else mine
    table = [
        [
            p["label"],
            g3(p["ai"]),
            g3(p["tflops"]),
            g3(p["gbps"]),
            g3(p["roof_tflops"]),
            g3(p["pct_of_roof"]),
            p["bound"],
        ]
        for p in shown
    ]
    doc.table(
        ["kernel", "FLOP/byte", "TFLOP/s", "GB/s", "roof TFLOP/s", "% of roof", "bound"],
        table,
        caption="the smallest and largest size of each kernel",
    )
    return {"points": placed, "copy_gbps": copy, "matmul_tflops": peaks}


def claims_section(ctx: Context, doc: Doc) -> dict:
    found = claims_mod.evaluate_claims(ctx.results)
    answers = claims_mod.answer_questions(ctx.results)
    held = sum(c["held"] is True for c in found)
    not_held = sum(c["held"] is False for c in found)
    doc.text(
        f"The lecture's claims, each checked against a figure measured in this run: **{held} held, {not_held} not "
        f"held, {len(found) - held - not_held} not applicable** on this device (n/a: not measurable here, e.g. a GPU "
        "effect on the CPU, or a section that failed)."
    )
    doc.table(
        ["#", "claim", "measured in this run", "criterion", "verdict"],
        [[i, c["claim"], c["figure"], c["criterion"], claims_mod.verdict(c["held"])] for i, c in enumerate(found, 1)],
    )
    doc.text("### Check your understanding")
    doc.table(
        ["#", "question", "answer, from this run", "verdict"],
        [[f"Q{i}", a["question"], a["answer"], claims_mod.verdict(a["held"])] for i, a in enumerate(answers, 1)],
    )
    headline = (
        f"**Claims reproduced on this device: {held} held, {not_held} not held, "
        f"{len(found) - held - not_held} n/a** (see [Claims reproduced](#sec-claims))"
    )
    return {"claims": found, "questions": answers, "headline": headline}


SECTIONS: list[Section] = [
    Section("device", "Device ceilings", device_section),
    Section("pitfalls", "Benchmarking done right and wrong", pitfalls_section),
    Section("matmul", "Scaling: matmul time and TFLOP/s against size", matmul_section),
    Section("mlp", "Scaling: an MLP against layers, steps, batch and dim", mlp_section),
    Section("gelu", "GELU five ways", gelu_section),
    Section("softmax", "Softmax all ways", softmax_section),
    Section("profile", "Profiling the lecture's cases", profile_section),
    Section("runahead", "The CPU runs ahead: timelines", runahead_section),
    Section("inspect", "Inside the Triton (and CUDA) kernels", inspect_section),
    Section("roofline", "Roofline", roofline_section, derived=True),
    Section("claims", "Claims reproduced", claims_section, derived=True),
]


def section_names() -> list[str]:
    return [s.name for s in SECTIONS]
