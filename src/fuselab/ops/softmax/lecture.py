"""What the lecture asks of softmax, answered from this run: question 5 (why a whole row to one block instead of one
element per thread), measured by setting the element-per-thread kernel (`triton-elementwise`) beside the
row-per-program one (`triton`) at the same shapes. Read by fuselab.studies.claims through `Op.questions`."""

from __future__ import annotations

import statistics

from fuselab.bench.record import Row
from fuselab.ops.findings import NotMeasured, Results, fmt_gbps, fmt_ms, fmt_x, op_rows, pairs

ROW = "triton"  # one row (or a few short ones) per program, held in registers: x read once, y written once
ELEMENT = "triton-elementwise"  # one element per thread, reduced through global memory (atomics)
ELEMENT_SLOWER = 2.0  # the element-per-thread kernel takes at least this many times the row kernel's time


def _issued(row: Row) -> tuple[int, int]:
    """(bytes the element-per-thread kernel asks of memory, the op's minimum) at this row's case."""
    from fuselab.ops.softmax.spec import bytes_moved
    from fuselab.ops.softmax.triton_elementwise import bytes_issued  # rows of it exist: Triton is installed

    shape, dtype = row.case.shape, row.case.torch_dtype
    return bytes_issued(shape, dtype), bytes_moved(shape, dtype)


def _size(nbytes: float) -> str:
    return f"{nbytes / 2**20:.3g} MiB"


def q_row_per_program(results: Results) -> tuple[str, float | None, bool | None]:
    rows = op_rows(results, "softmax")
    found = sorted(pairs(rows, ELEMENT, ROW, "float32"), key=lambda p: p[0].case.shape[-1])
    if not found:
        timed = {r.case.impl for r in rows if r.measured and r.median_ms}
        why = (
            "on the CPU the Triton kernels run under the interpreter, checked for correctness but never timed"
            if not timed & {ROW, ELEMENT}
            else f"no fp32 timings of {ROW} and {ELEMENT} at the same shape"
        )
        raise NotMeasured(why)
    ratios = [e.median_ms / r.median_ms for e, r in found]  # type: ignore[operator]
    ratio = statistics.median(ratios)
    widest = max(found, key=lambda p: p[0].case.shape[-1])
    e, r = widest
    issued, minimum = _issued(e)
    text = (
        "A row's max and sum are reductions: whoever holds the whole row computes them in registers, reading x once "
        "and writing y once. Give each thread one element instead and the row's elements meet only in global memory: "
        "the element-per-thread kernel here runs three launches (an atomic max per element into a per-row buffer, "
        "an atomic add of exp(x - max) per element, then y = exp(x - max) / sum), so it reads x three times and "
        "issues 2 atomics per element, all the elements of a row contending for one address. Measured in fp32, "
        f"median over {len(found)} shapes: it takes {fmt_x(ratio)} the row-per-program kernel's time; at width "
        f"{e.case.shape[-1]:,} ({e.numel:,} elements) {fmt_ms(e.median_ms)} against {fmt_ms(r.median_ms)}, "
        f"moving {_size(issued)} (x 3 reads + y 1 write + atomics) where {_size(minimum)} is the op's minimum "
        f"(1 read + 1 write): {fmt_gbps(e.gbps)} of useful traffic against {fmt_gbps(r.gbps)}."
    )
    table = [
        "| width | rows | row per program | element per thread | × time | useful GB/s (row / element) "
        "| bytes moved (element / minimum) | element's GB/s on the bytes it moves |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for e, r in found:
        moved, minimum = _issued(e)
        shape = e.case.shape
        table.append(
            f"| {shape[-1]:,} | {shape[0] if len(shape) > 1 else 1:,} | {fmt_ms(r.median_ms)} "
            f"| {fmt_ms(e.median_ms)} | {fmt_x(e.median_ms / r.median_ms)} "
            f"| {fmt_gbps(r.gbps)} / {fmt_gbps(e.gbps)} | {_size(moved)} / {_size(minimum)} "
            f"| {fmt_gbps(moved / (e.median_ms * 1e-3) / 1e9)} |"
        )
    text += "\n\nfp32, the same shapes, timed side by side:\n\n" + "\n".join(table)
    return text, ratio, ratio >= ELEMENT_SLOWER


QUESTIONS = [
    (
        5,
        "Why does the softmax kernel give one whole row to one block instead of one element per thread?",
        f"element per thread ≥ {ELEMENT_SLOWER:g}× the row-per-program kernel's time (median over shapes)",
        q_row_per_program,
    ),
]
