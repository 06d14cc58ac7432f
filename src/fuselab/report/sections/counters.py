"""The hardware-counters section: every op's impls under Nsight Compute, DRAM bytes against the cost model.

An op whose report times its backward has it profiled too (forward + backward), for its own kernels and the peers
they race; a compute-bound op gets a table of its kernels' tensor-pipe use, occupancy and stalls.

Generic over ops: it loops over fuselab.ops.all_ops() and reads each op's cost model; it names none. Without a GPU,
ncu or permission to read counters it says why in one line and returns, so the rest of the report is unaffected.
"""

from __future__ import annotations

from fuselab.bench.shapes import format_shape
from fuselab.ops.registry import all_ops
from fuselab.report.doc import Doc
from fuselab.report.runner import Context
from fuselab.report.sections._common import g3


def counters_section(ctx: Context, doc: Doc) -> dict:
    from fuselab.profile.counters import (
        Case,
        CountersUnavailable,
        affordable_shape,
        counters_unavailable,
        dram_peak_gbps,
        plot_rooflines,
        run_cases,
        study_shapes,
    )

    reason = counters_unavailable(ctx.device)
    if reason:
        doc.text(f"Skipped: {reason}.")
        return {"skipped": reason}
    cases, dtype_of = [], {}
    for op in all_ops():
        shapes = study_shapes(op)[0 if ctx.mode == "gpu" else 1 :]  # the large shape on the full GPU report
        dtype = dtype_of[op.name] = next(iter(op.report_plan(ctx.mode)["bench_dtypes"]))  # attention: bfloat16
        timed_backward = "forward+backward" in op.report_plan(ctx.mode)["passes"]
        for name, impl in op.impls.items():
            if impl.compiled:  # torch.compile under ncu compiles again, slowly; its kernels are in `fuselab bench`
                continue
            pick = affordable_shape(op, name, shapes, ctx.device, ctx.budget["max_call_ms"], dtype)
            cases.append(Case(op.name, name, shapes[pick], dtype))
            if timed_backward and impl.backward and (impl.inspectable or name in op.defaults.peers):
                cases.append(Case(op.name, name, shapes[pick], dtype, backward=True))
    try:
        result = run_cases(cases, out_dir=ctx.out / "counters")
    except CountersUnavailable as exc:
        doc.text(f"Skipped: {exc}.")
        return {"skipped": str(exc)}
    doc.text(
        "Nsight Compute's hardware counters for each impl (one call, caches flushed before each kernel, clocks "
        "left alone): the DRAM bytes its kernels actually moved against the fewest the op must move (its cost "
        "model), and one verdict per kernel. A fused kernel moves about 1x the minimum; an unfused chain moves "
        "that once per kernel. At small sizes the written bytes may stay in L2 and read below 1x."
    )
    rows_by_op: dict[str, list[dict]] = {}
    for row in result.rows:
        rows_by_op.setdefault(row["op"], []).append(row)
    headlines = []
    for op_name, rows in rows_by_op.items():
        shape = format_shape(tuple(rows[0]["shape"]))
        table = []
        for r in rows:
            label = case_label(r, rows[0]["shape"])
            if r.get("error"):
                table.append([label, "", "", "", "", "", f"failed: {r['error']}"])
                continue
            longest = max(r["kernels"], key=lambda k: k["duration_ns"])
            table.append(
                [
                    label,
                    r["n_kernels"],
                    f"{g3(r['dram_read'] / 1e6)} / {g3(r['dram_write'] / 1e6)}",
                    f"{r['bytes_ratio']:.2f}x",
                    g3(r["l2_bytes"] / 1e6),
                    g3(r["duration_ns"] / 1e3),
                    f"{longest['short_name'][:40]}: {longest['verdict']}",
                ]
            )
        doc.text(f"### {op_name}, {shape}, {dtype_of[op_name]} (minimum {g3(rows[0]['model_bytes'] / 1e6)} MB)")
        doc.table(
            ["impl", "kernels", "DRAM MB read / written", "x minimum", "L2 MB", "µs", "longest kernel: verdict"], table
        )
        if any(r.get("bound_model") == "compute" and r.get("kernels") for r in rows):
            doc.text(
                "Each kernel of at least 5% of its call's time: the tensor pipe's share of its peak, the SM's "
                "busiest pipe, the warps resident against what the kernel's registers and shared memory allow "
                "(achieved / theoretical occupancy, and what limits it) and where warps wait most (cycles per "
                "instruction issued)."
            )
            doc.table(
                ["impl", "kernel", "µs", "tensor %", "SM %", "occupancy % (limit)", "registers", "top stalls"],
                kernel_rows(rows),
            )
        # the headline: forward calls at one shape
        ok = [r for r in rows if not r.get("error") and r["shape"] == rows[0]["shape"] and not r.get("backward")]
        if len(ok) >= 2:
            most, least = max(ok, key=lambda r: r["bytes_ratio"]), min(ok, key=lambda r: r["bytes_ratio"])
            headlines.append(
                f"{op_name} {shape}: {most['impl']} moves {most['bytes_ratio']:.2f}x the minimum DRAM bytes "
                f"({most['n_kernels']} kernels), {least['impl']} {least['bytes_ratio']:.2f}x"
            )
    if headlines:
        doc.text("\n".join(f"- {h}" for h in headlines))
    device = ctx.results.get("device") or {}
    plots = []
    if device.get("copy_gbps") and device.get("matmul_tflops"):
        for path in plot_rooflines(
            result.rows, device["copy_gbps"], device["matmul_tflops"], ctx.plot("x").parent, "counters_roofline"
        ):
            doc.image(path, path.stem.replace("_", " "))
            plots.append(str(path))
    return {
        "rows": result.rows,
        "source": result.source,
        "dram_peak_gbps": dram_peak_gbps(result.rows),
        "headline": "; ".join(headlines) if headlines else None,
    }


def case_label(row: dict, shape: list[int]) -> str:
    """The impl, at its shape when not the op's large one (an impl too slow for ncu there is profiled at the small
    one), and "forward + backward" for a backward case."""
    at = "" if row["shape"] == shape else f" at {format_shape(tuple(row['shape']))}"
    return row["impl"] + at + (", forward + backward" if row.get("backward") else "")


def kernel_rows(rows: list[dict], least_share: float = 0.05) -> list[list]:
    """One table row per kernel of each case that takes at least `least_share` of the case's kernel time."""
    table = []
    for r in rows:
        if r.get("error") or not r.get("kernels"):
            continue
        total = sum(k["duration_ns"] for k in r["kernels"]) or 1.0
        for k in r["kernels"]:
            if k["duration_ns"] < least_share * total:
                continue
            limit = f" ({k['occupancy_limiter']})" if k.get("occupancy_limiter") else ""
            occupancy = f"{g3(k.get('occupancy_pct'))} / {g3(k.get('theoretical_occupancy_pct'))}{limit}"
            stalls = ", ".join(f"{name} {cycles:.2g}" for name, cycles in (k.get("stalls") or [])[:2])
            table.append(
                [
                    case_label(r, rows[0]["shape"]),
                    k["short_name"][:48],
                    g3(k["duration_ns"] / 1e3),
                    g3(k.get("tensor_pct")),
                    g3(k.get("sm_pct")),
                    occupancy,
                    g3(k.get("registers")),
                    stalls,
                ]
            )
    return table
