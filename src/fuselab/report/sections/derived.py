"""The derived sections: they only read the others' results (the roofline, the claims), so they are always redone."""

from __future__ import annotations

from fuselab.bench.dtypes import short_name
from fuselab.bench.record import Row
from fuselab.bench.results import ABOVE_MARK
from fuselab.bench.shapes import format_shape
from fuselab.evaluate import ABOVE_CEILING_PCT
from fuselab.ops.registry import all_ops
from fuselab.report.doc import Doc
from fuselab.report.runner import Context
from fuselab.report.sections._common import g3
from fuselab.studies import claims as claims_mod
from fuselab.studies import roofline


def roofline_points(results: dict[str, dict]) -> list[roofline.Point]:
    """The measured kernels as roofline points: matmuls at every size, every op's timings at its default options."""
    points = []
    for r in results.get("matmul", {}).get("rows", []):
        if not r.get("error"):
            points.append(
                roofline.Point(
                    label=f"matmul {r['n']} {short_name(r['dtype'])}",
                    group=f"matmul {short_name(r['dtype'])}",
                    family="matmul",
                    kind="matmul",
                    dtype=r["dtype"],
                    flops=r["flops"],
                    bytes=r["bytes"],
                    median_ms=r["median_ms"],
                )
            )
    for op in all_ops():  # every op's timings at its default options
        defaults = op.default_options()
        for r in (Row.from_json(r) for r in results.get(op.name, {}).get("bench", [])):
            options = {k: r.field(k) for k in defaults}
            if not r.measured or options != defaults or not r.median_ms:
                continue
            impl, dtype = r.case.impl, short_name(r.case.dtype)
            points.append(
                roofline.Point(
                    label=f"{op.name} {impl} {dtype} {format_shape(r.case.shape)}",
                    group=f"{op.name} {impl} {dtype}",
                    family=op.name,
                    kind="matmul" if op.bound == "compute" else "elementwise",  # compute-bound: tensor cores
                    dtype=r.case.dtype,
                    flops=op.flops(r.case.shape, **options),
                    bytes=r.bytes,
                    median_ms=r.median_ms,
                )
            )
    return points


def _past_roof(placed: roofline.Placed) -> bool:
    return placed.pct_of_roof is not None and placed.pct_of_roof > ABOVE_CEILING_PCT


def roofline_section(ctx: Context, doc: Doc) -> dict:
    device = ctx.need("device")
    points = roofline_points(ctx.results)
    if not points:
        raise LookupError("no measured kernel to place: the matmul and op sections did not finish")
    copy, peaks = device["copy_gbps"], device["matmul_tflops"]
    placed = roofline.place_all(points, copy, peaks)
    doc.text(
        f"Each measured kernel at its arithmetic intensity (FLOPs per byte it must move) against the roofs measured "
        f"here: memory {copy:.0f} GB/s, compute "
        + ", ".join(f"{k} {v:.3g} TFLOP/s" for k, v in peaks.items())
        + ". Left of a ridge point a kernel is memory-bound (elementwise and row-wise ops: a handful of FLOPs per "
        "byte); right of it compute-bound (large matmuls, attention). Memory-bound ops are held against the fp32 "
        "rate, compute-bound ones against the tensor-core rate of their dtype. % of roof is achieved TFLOP/s over "
        "the roof at that intensity."
    )
    doc.image(
        roofline.plot_roofline(placed, copy, peaks, ctx.plot("roofline.png")),
        "Roofline: measured kernels against the measured ceilings (log-log).",
    )
    shown = []
    for group in dict.fromkeys(p.point.group for p in placed):
        mine = sorted((p for p in placed if p.point.group == group), key=lambda p: p.point.flops)
        shown += [mine[0], mine[-1]] if len(mine) > 1 else mine
    table = [
        [
            p.point.label,
            g3(p.ai),
            g3(p.tflops),
            g3(p.gbps),
            g3(p.roof_tflops),
            g3(p.pct_of_roof) + (ABOVE_MARK if _past_roof(p) else ""),
            p.bound,
        ]
        for p in shown
    ]
    doc.table(
        ["kernel", "FLOP/byte", "TFLOP/s", "GB/s", "roof TFLOP/s", "% of roof", "bound"],
        table,
        caption="the smallest and largest size of each kernel",
    )
    if any(_past_roof(p) for p in placed):
        doc.text(
            f"{ABOVE_MARK} past its roof (over {ABOVE_CEILING_PCT:.0f}%): faster than the ceilings measured here "
            "allow, so the data stayed in a cache, the ceilings were measured low (a busy CPU, a cold clock), or the "
            "time is wrong"
        )
    return {"points": [p.to_json() for p in placed], "copy_gbps": copy, "matmul_tflops": peaks}


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
        [
            [
                i,
                c["claim"],
                c["figure"],
                c["criterion"],
                claims_mod.verdict(c["held"], c.get("noisy", False), c.get("past", False)),
            ]
            for i, c in enumerate(found, 1)
        ],
    )
    doc.text("### Check your understanding: the lecture's questions, answered from this run")
    short = [a["answer"].split("\n\n", 1) for a in answers]
    doc.table(
        ["#", "question", "answer, from this run", "verdict"],
        [
            [f"Q{i}", a["question"], s[0], claims_mod.verdict(a["held"], a.get("noisy", False), a.get("past", False))]
            for i, (a, s) in enumerate(zip(answers, short, strict=True), 1)
        ],
    )
    for i, (a, s) in enumerate(zip(answers, short, strict=True), 1):
        if len(s) > 1:
            doc.text(f"**Q{i} in detail.** {a['question']}\n\n{s[1]}")
    headline = (
        f"**Claims reproduced on this device: {held} held, {not_held} not held, "
        f"{len(found) - held - not_held} n/a** (see [Claims reproduced](#sec-claims))"
    )
    return {"claims": found, "questions": answers, "headline": headline}
