"""The scaling sections: matmul time and TFLOP/s against size, and an MLP against layers, steps, batch and dim."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from fuselab.bench.dtypes import short_name
from fuselab.bench.results import pyplot, save_figure
from fuselab.report.doc import Doc
from fuselab.report.runner import Context
from fuselab.report.sections._common import first_line, g3, ms
from fuselab.studies import scaling


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
    ok = [r for r in rows if r.error is None]
    peaks = ctx.results.get("device", {}).get("matmul_tflops", {})
    regimes: dict[str, scaling.Regimes] = {}
    for dtype in b["matmul_dtypes"]:
        mine = sorted((r for r in ok if r.dtype == dtype), key=lambda r: r.n)
        if len(mine) >= 3:
            regimes[dtype] = scaling.regimes([r.n for r in mine], [r.median_ms for r in mine])
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
        short = short_name(dtype)
        peak = peaks.get(short)
        sizes = sorted(r.n for r in ok if r.dtype == dtype)
        slope_at = dict(zip(sizes, regimes[dtype].local_exponents if dtype in regimes else (), strict=False))
        for r in sorted((r for r in rows if r.dtype == dtype), key=lambda r: r.n):
            if r.error is not None:
                table.append([r.n, dtype, "failed: " + first_line(r.error), "", "", ""])
                continue
            table.append(
                [
                    r.n,
                    dtype,
                    ms(r.median_ms),
                    g3(r.tflops),
                    f"{100 * r.tflops / peak:.1f}%" if peak else "",
                    f"{slope_at[r.n]:.2f}" if r.n in slope_at else "",
                ]
            )
    doc.table(["n", "dtype", "time", "TFLOP/s", "% of matmul ceiling", "local exponent"], table)
    lines = []
    for dtype, reg in regimes.items():
        cubic = f"from n = {reg.cubic_from}" if reg.cubic_from else "not reached at these sizes"
        lines.append(
            f"- {dtype}: time stays within 2× of the smallest size's up to n = {reg.flat_until} (slope "
            f"{reg.small_exponent:.2f} over the three smallest sizes); cubic growth (slope ≥ 2.5) {cubic} "
            f"(slope {reg.large_exponent:.2f} over the three largest)."
        )
    doc.text("\n".join(lines))
    series = {short_name(d): [(r.n, r.median_ms) for r in ok if r.dtype == d] for d in b["matmul_dtypes"]}
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
    tf = {short_name(d): [(r.n, r.tflops) for r in ok if r.dtype == d] for d in b["matmul_dtypes"]}
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
    return as_json({"rows": rows, "regimes": regimes})


def as_json(value: object) -> object:
    """`value` with the study's points and fits (dataclasses, in dicts and lists) as dicts: the section's record."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, dict):
        return {k: as_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [as_json(v) for v in value]
    return value


def line_plot(
    series: dict[str, list[tuple[float, float]]],
    path: Path,
    *,
    xlabel: str,
    ylabel: str,
    title: str = "",
    logy: bool = False,
    hlines: dict[str, float] | None = None,
    dashed: set[str] | None = None,
) -> Path:
    """One line per series of (x, y) points, x on a log2 axis; hlines: labelled horizontal lines (ceilings)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for label, pts in series.items():
        if not pts:
            continue
        pts = sorted(pts)
        style = {"linestyle": "--", "color": "grey", "linewidth": 1} if label in (dashed or set()) else {"marker": "o"}
        ax.plot([p[0] for p in pts], [p[1] for p in pts], label=label, **style)
    for i, (label, y) in enumerate((hlines or {}).items()):
        ax.axhline(y, color="black", linestyle=[":", "-.", "--"][i % 3], linewidth=1, label=label)
    ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


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
        pts = scaling.measured(rows, axis)
        fit = fits.get(axis)
        table.append(
            [
                axis,
                ", ".join(str(v) for v, _ in pts),
                ", ".join(ms(t) for _, t in pts),
                f"{fit.slope:.4g} ms per unit" if fit else "",
                f"{fit.intercept:.4g} ms" if fit else "",
                f"{fit.r2:.4f}" if fit else "",
                f"{fit.exponent:.2f}" if fit else "",
            ]
        )
    doc.table(["axis", "values", "time", "slope", "intercept", "R²", "log-log exponent"], table)
    failed = [r for r in rows if r.error is not None]
    if failed:
        doc.text(
            f"{len(failed)} point(s) failed: " + "; ".join(f"{r.axis}={r.value}: {first_line(r.error)}" for r in failed)
        )
    doc.image(_mlp_plot(rows, fits, ctx.plot("mlp.png")), "MLP time against each axis, with the fitted line.")
    return as_json({"base": base, "rows": rows, "fits": fits})


def _mlp_plot(rows: list[scaling.MlpPoint], fits: dict[str, scaling.AxisFit], path: Path) -> Path:
    plt = pyplot()
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.8))
    for ax, axis in zip(axes, scaling.MLP_AXES, strict=True):
        pts = scaling.measured(rows, axis)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o", label="measured")
        fit = fits.get(axis)
        if fit and pts:
            xs = [pts[0][0], pts[-1][0]]
            ax.plot(
                xs,
                [fit.intercept + fit.slope * x for x in xs],
                "-",
                color="black",
                linewidth=1,
                label=f"fit, R² = {fit.r2:.3f}",
            )
        ax.set_xlabel(axis)
        ax.set_ylabel("ms")
        ax.set_title(f"time vs {axis}" + (f" (exp. {fit.exponent:.2f})" if fit else ""))
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    return save_figure(fig, path)
