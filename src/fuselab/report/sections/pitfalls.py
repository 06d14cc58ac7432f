"""The pitfalls section: one kernel timed without warm-up, without synchronize, and correctly."""

from __future__ import annotations

from pathlib import Path

from fuselab.bench.dtypes import DTYPES, short_name
from fuselab.bench.results import pyplot, save_figure
from fuselab.bench.shapes import format_shape
from fuselab.ops.registry import Op, all_ops
from fuselab.report.doc import Doc
from fuselab.report.runner import Context
from fuselab.report.sections._common import first_line, ms, pow2
from fuselab.studies import pitfalls


def _pitfall_maker(case: dict, device: str) -> tuple[str, pitfalls.Maker]:
    dtype = DTYPES[case["dtype"]]
    short = short_name(case["dtype"])
    if case["kind"] == "matmul":
        n = case["n"]
        return f"matmul {n}³ {short}", pitfalls.matmul_maker(n, dtype, device)
    shape = tuple(case["shape"])
    op = pitfall_op(case["impl"])
    what = {"compile": "torch.compile"}.get(case["impl"], case["impl"])
    label = f"{op.name} {what} {format_shape(tuple(pow2(s) for s in shape))} {short}"
    return label, pitfalls.op_maker(op.name, case["impl"], shape, dtype, device)


def pitfall_op(impl: str) -> Op:
    """The op whose impl the pitfalls time: the first memory-bound op registered with that impl."""
    for op in all_ops():
        if op.bound == "memory" and impl in op.impls:
            return op
    raise LookupError(f"no memory-bound op has an impl named {impl!r}")


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
    plt = pyplot()
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
    return save_figure(fig, path)
