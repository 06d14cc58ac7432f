"""The inspect section: a table of the compiled fused kernels, one row each: registers, spills, shared memory and
the widest global load and store."""

from __future__ import annotations

import re

import torch

from fuselab.bench.memory import format_bytes
from fuselab.ops.registry import all_ops
from fuselab.profile.asm import GlobalAccess, KernelAsm
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
        + (
            ""
            if ctx.on_gpu
            else " Without a GPU the Triton kernels are compiled for sm_90 as the JIT would, with the launch "
            "parameters the CPU run chose: an impl whose plans differ under the interpreter (smaller tiles, fewer "
            "warps) shows those, not a GPU's."
        )
    )
    items: list[dict] = []
    rows: list[list[str]] = []
    notes: list[str] = []
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
        rows += [kernel_row(op_name, impl, k) for k in inspection.kernels]
        notes += [f"{op_name} / {impl}: {n}" for n in inspection.notes]
    if rows:
        doc.table(HEADERS, rows, caption="one row per compiled kernel (float32)")
    if notes:
        doc.text("\n".join(f"- {n}" for n in notes))
    if all("error" in i for i in items):
        raise RuntimeError("no kernel could be inspected: " + "; ".join(i["error"] for i in items))
    return {"items": items}


HEADERS = ["op / impl", "kernel", "warps", "registers", "spills", "shared", "widest load", "widest store"]


def kernel_row(op_name: str, impl: str, kernel: KernelAsm) -> list[str]:
    """A kernel's line of the table: registers per thread, spilled bytes, shared memory, and the widest global load
    and store with its bytes per thread (8 or more: vectorized)."""
    r = kernel.resources
    spilled = (r.spill_stores or 0) + (r.spill_loads or 0)
    spills = "" if r.spill_stores is None else "none" if spilled == 0 else f"{r.spill_stores} B / {r.spill_loads} B"
    return [
        f"{op_name} / {impl}",
        short_kernel_name(kernel.name),
        "" if kernel.num_warps is None else str(kernel.num_warps),
        "" if r.registers is None else str(r.registers),
        f"**{spills}**" if spilled else spills,
        "" if r.shared_bytes is None else format_bytes(r.shared_bytes),
        widest(kernel.loads),
        widest(kernel.stores),
    ]


def short_kernel_name(name: str, width: int = 56) -> str:
    """A kernel's (demangled) name without its return type, namespaces and argument list, cut to `width` characters:
    "void fuselab::(anonymous namespace)::k<float, (fuselab::Form)1>(float const*, long)" -> "k<float, (Form)1>"."""
    name = re.sub(r"\b[A-Za-z_]\w*::", "", name.removeprefix("void ").replace("(anonymous namespace)::", ""))
    if name.endswith(")"):  # the argument list: from the parenthesis that closes the name's last one
        depth = 0
        for i in range(len(name) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(name[i], 0)
            if depth == 0:
                name = name[:i]
                break
    return name if len(name) <= width else name[: width - 1] + "…"


def widest(accesses: list[GlobalAccess]) -> str:
    """The widest global access form and its bytes per thread ("ld.global.v4.b32 (16 B)"), or "none"."""
    if not accesses:
        return "none"
    a = accesses[0]
    return f"`{a.instr}` ({a.bytes} B)" if a.bytes else f"`{a.instr}`"
