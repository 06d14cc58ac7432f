"""`check_op`: is every impl right on every input? Each case against the float64 reference, gradients too; one
CheckRow a case, and one CheckSummary per impl and dtype."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import torch

from fuselab.bench.accuracy import gradient_error, poison_allocator
from fuselab.bench.dtypes import dtype_name
from fuselab.bench.record import Case, CheckRow, CheckSummary, Verdict
from fuselab.bench.shapes import apply_layout
from fuselab.bench.sweep import NotRun, TooBig, run_sweep
from fuselab.evaluate.cases import (
    Reference,
    fresh_seed,
    option_grid,
    prepare,
    refuse_if_nothing_fits,
    refuse_if_too_big,
    sweep_cost,
)
from fuselab.evaluate.selection import Selection
from fuselab.ops.registry import Impl, Op, Shape


def check_case(
    op: Op,
    impl: Impl,
    shape: Shape,
    dtype: torch.dtype,
    device: str,
    options: dict,
    seed: int,
    grad: bool = True,
    layout: str = "contiguous",
) -> dict[str, object]:
    """One impl on one fresh random input against the float64 reference (and its gradient, if it has one).

    The forward's reference is made a slice of rows at a time where the op allows it (`Reference`, as the bench
    makes it): about 3x the input, not 9x (2^31 fp32 elements: 26 GB, not 80, which an 80 GB GPU could not hold).
    layout: the inputs' memory layout (fuselab.bench.shapes.apply_layout: contiguous, transposed, sliced, expanded).
    """
    fn = prepare(impl, device, dtype)
    inputs = tuple(apply_layout(x, layout) for x in op.make_inputs(shape, dtype, device, seed, **options))
    reference = Reference(op, inputs, options)
    poison_allocator(math.prod(reference.shape) * inputs[0].element_size(), device)
    out = fn(*inputs, **options)
    if out.dtype != inputs[0].dtype:
        raise TypeError(f"{impl.name} returned {dtype_name(out.dtype)} for {dtype_name(inputs[0].dtype)} input")
    row: dict[str, object] = {"rel_err": reference.error(out), "grad_rel_err": None}
    if grad and impl.backward and shape and all(shape):
        gen = torch.Generator(device="cpu").manual_seed(seed + 1)
        dy = torch.randn(reference.shape, generator=gen, dtype=torch.float64).to(device)
        xs = [x.detach().requires_grad_(True) for x in inputs]
        fn(*xs, **options).backward(dy.to(dtype))
        if any(x.grad.dtype != dtype for x in xs):
            raise TypeError(
                f"{impl.name} returned gradients in {[dtype_name(x.grad.dtype) for x in xs]} for {dtype_name(dtype)}"
            )
        xs64 = [x.detach().to(torch.float64).requires_grad_(True) for x in inputs]
        op.reference(*xs64, **options).backward(dy)
        scales = op.gradient_scale(*(x.detach() for x in xs64), dy=dy, **options) if op.gradient_scale else None
        row["grad_rel_err"] = gradient_error([x.grad for x in xs], [x.grad for x in xs64], scales)
    return row


def check_op(
    op: Op,
    selection: Selection | None = None,
    *,
    seed: int | None = None,
    show_progress: bool = True,
    grad: bool = True,
    refuse_early: bool = False,
) -> list[CheckRow]:
    """A CheckRow (its Case, rel_err, grad_rel_err, tolerance, status, reason, seed) for every combination of the
    selection (None: everything, `Selection.resolved` fills what it leaves out).

    status: "pass", "FAIL" (error over tolerance, or an exception), "unavailable" or "refused" (with the reason).
    Triton under the CPU interpreter is checked in float32 only (the interpreter is weak below fp32).
    The selection's layouts are the inputs' memory layouts (`check_case`), each case checked in each; rows of a
    layout other than contiguous carry it.
    grad: check gradients too, where the impl has a backward.
    refuse_early: when no case fits in the device's free memory, raise TooBig (`refuse_if_nothing_fits`) before any
    work instead of returning refused rows.
    """
    chosen = (selection or Selection()).resolved(op, "check")  # unknown impl names fail before any work
    names, dtypes, shapes, options = chosen.impls, chosen.dtypes, chosen.shapes, chosen.options
    device = chosen.device
    seed = fresh_seed() if seed is None else seed
    if refuse_early:
        refuse_if_nothing_fits(op, shapes, dtypes, device, option_grid(op, options), pieces=not grad)
    cases = [
        Case.of(op.name, name, dtype, shape, opts, layout=layout, pass_=None)
        for name in names
        for dtype in dtypes
        for shape in shapes
        for layout in chosen.layouts
        for opts in option_grid(op, options)
    ]

    def run(case: Case) -> dict:
        impl, dtype, shape, opts = op.get_impl(case.impl), case.torch_dtype, case.shape, case.option_values
        reason = impl.unavailable(device, dtype)
        if not reason and device == "cpu" and "triton" in impl.name and dtype != torch.float32:
            reason = "the Triton interpreter is checked in float32 only"
        tolerance = op.tolerance[dtype] * impl.tolerance_scale
        if reason:
            return {"status": "unavailable", "reason": reason, "tolerance": tolerance}
        case_seed = seed + len(shape) * 7919 + sum(shape)
        try:
            refuse_if_too_big(op, shape, dtype, device, opts, pieces=not (grad and impl.backward))
            row = check_case(op, impl, shape, dtype, device, opts, case_seed, grad, case.layout)
        except TooBig as exc:  # refused before it allocates
            return {"status": "refused", "reason": str(exc), "tolerance": tolerance}
        except NotRun as exc:  # the impl says it cannot run this case here (a forced backend without a kernel)
            return {"status": "unavailable", "reason": str(exc), "tolerance": tolerance}
        except Exception as exc:
            return {"status": "FAIL", "reason": f"{type(exc).__name__}: {exc}"[:500], "tolerance": tolerance}
        over = [
            f"{what} relative error {e:.2g} over the {case.dtype} tolerance {tolerance:g}"
            for what, e in (("output", row["rel_err"]), ("gradient", row["grad_rel_err"]))
            if e is not None and not e <= tolerance
        ]
        verdict = {"status": "FAIL", "reason": "; ".join(over)} if over else {"status": "pass"}
        return {**row, "tolerance": tolerance, **verdict, "seed": case_seed}

    rows = run_sweep(
        cases, run, out=None, description=f"check {op.name}", show_progress=show_progress, cost=sweep_cost(op)
    )
    known = [f.name for f in dataclasses.fields(CheckRow) if f.name not in ("case", "device")]
    return [
        CheckRow(case=case, device=device, **{k: row[k] for k in known if k in row})  # type: ignore[arg-type]
        for case, row in zip(cases, rows, strict=True)
    ]


def summarize_checks(rows: Sequence[CheckRow]) -> list[CheckSummary]:
    """One summary per impl, dtype, layout and option values: the worst errors; FAIL if any case failed, else pass if
    any passed (the reason then counts the cases not run, e.g. "2 of 5 cases unavailable: ..."), else the first
    case's status."""
    groups: dict[Case, list[CheckRow]] = {}
    for row in rows:
        groups.setdefault(dataclasses.replace(row.case, shape=()), []).append(row)
    out = []
    for case, members in groups.items():
        failed = [m for m in members if m.status is Verdict.FAIL]
        not_run = [m for m in members if not m.status.ran]
        if failed or len(not_run) in (0, len(members)):
            worst = (failed or members)[0]
            status, reason = worst.status, worst.reason
        else:
            status = Verdict.PASS
            reason = f"{len(not_run)} of {len(members)} cases {not_run[0].status}: {not_run[0].reason}"

        def worst_of(errors: list[float | None]) -> float | None:
            values = [e for e in errors if e is not None]
            return max(values) if values else None

        out.append(
            CheckSummary(
                impl=case.impl,
                dtype=case.dtype,
                options=case.options,
                layout=case.layout,
                cases=len(members),
                rel_err=worst_of([m.rel_err for m in members]),
                grad_rel_err=worst_of([m.grad_rel_err for m in members]),
                tolerance=members[0].tolerance,
                status=status,
                reason=reason,
            )
        )
    return out
