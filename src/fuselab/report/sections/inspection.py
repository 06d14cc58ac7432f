"""The inspect section: registers, spills, shared memory and load widths of the compiled fused kernels."""

from __future__ import annotations

import torch

from fuselab.ops.registry import all_ops
from fuselab.report.doc import Doc
from fuselab.report.runner import Context


def op_source_lines(op_name: str, impl: str) -> list[str]:
    """The source lines of an impl's Triton kernels (how heavy an offline compile of them is)."""
    import inspect as pyinspect

    from fuselab.ops.registry import get_op

    kernels = get_op(op_name).get_impl(impl).triton_kernels or (lambda: ())
    lines: list[str] = []
    for k in kernels():
        fn = getattr(k, "fn", k)
        try:
            lines += pyinspect.getsource(fn).splitlines()
        except (OSError, TypeError):
            lines.append("?")
    return lines


def inspect_section(ctx: Context, doc: Doc) -> dict:
    from fuselab.profile.inspect import inspect_impl

    doc.text(
        "What the fused kernels compile to: registers per thread, spills, shared memory, and the widest global "
        "load and store (`ld.global.v4.b32` moves 16 bytes per thread: vectorized; `.b32` only 4). The PTX and SASS "
        "themselves are not kept here: `fuselab inspect OP --impl IMPL --out DIR` writes them."
        + ("" if ctx.on_gpu else " Without a GPU the Triton kernels are compiled for sm_90 as the JIT would.")
    )
    items = []
    which = ctx.budget["inspect"]
    chosen = [
        (op.name, name)
        for op in all_ops()
        for name, impl in op.impls.items()
        if impl.inspectable and (which == "all" or (which in ("triton", "first")) == (impl.triton_kernels is not None))
    ]
    if which == "first":
        chosen = [min(chosen, key=lambda pair: len(op_source_lines(*pair)))] if chosen else []
    for op_name, impl in chosen:
        try:
            inspection = inspect_impl(op_name, impl, dtype=torch.float32)
        except Exception as exc:  # one failing (no nvcc, say) leaves the others
            error = f"{type(exc).__name__}: {exc}".strip()
            items.append({"op": op_name, "impl": impl, "error": error[:3000]})
            doc.code(error, caption=f"{op_name} / {impl}: could not inspect", folded=True)
            continue
        items.append({**inspection.to_json(), "summary": inspection.summary()})
        doc.code(inspection.summary(), caption=f"{op_name} / {impl}")
    if all("error" in i for i in items):
        raise RuntimeError("no kernel could be inspected: " + "; ".join(i["error"] for i in items))
    return {"items": items}
