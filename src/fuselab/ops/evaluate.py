"""Check and benchmark any registered op: every impl against the float64 reference, then timed side by side.

`check_op` answers "is it right on every input?"; `bench_op` answers "how fast, and how far from the
limit?" through the harness (fuselab.bench), one JSON row per case.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from fuselab.bench import ceilings as ceilings_mod
from fuselab.bench import distributed
from fuselab.bench.compiled import WatchedCompile
from fuselab.bench.dtypes import dtype_name
from fuselab.bench.env import row_provenance
from fuselab.bench.memory import format_bytes, free_bytes
from fuselab.bench.record import Case, CheckRow, CheckSummary, Row, Verdict
from fuselab.bench.shapes import add_ratios, apply_layout, draw_shapes, format_shape, size_ladder, summarize
from fuselab.bench.sweep import NotRun, Status, Sweep, run_sweep
from fuselab.bench.timer import Timing, benchmark, benchmark_side_by_side, call_cost
from fuselab.ops.backends import triton_unavailable
from fuselab.ops.registry import Impl, Op, Shape, all_ops

PASSES = ("forward", "forward+backward")
POISON_BYTES = 8 * 2**30  # at most this much memory is poisoned before a check
REFERENCE_TOO_BIG = "the float64 reference did not fit in memory: not checked at this size"


class Unavailable(NotRun, RuntimeError):
    """An impl that cannot run here; the message says why."""

    status = Status.UNAVAILABLE


class Skipped(NotRun):
    """An impl not timed here on purpose; the message says why."""

    status = Status.SKIPPED


class TooBig(NotRun):
    """A case refused before it allocates: it would not fit in the device's free memory."""

    status = Status.REFUSED


INTERPRETER_SKIP = "the Triton interpreter on the CPU is for correctness only (`fuselab check` runs it); not timed"


def interpreted(impl: Impl, device: str) -> bool:
    """Whether `impl` would run under Triton's CPU interpreter on `device` (checked, never timed)."""
    return torch.device(device).type == "cpu" and impl.requires is triton_unavailable


@dataclass(frozen=True)
class ImplStatus:
    """One impl of one op on one device: `reason` None when it runs there (else why not); `interpreted`: it runs
    under Triton's CPU interpreter there (right, but slow: checked, never timed)."""

    op: str
    impl: str
    reason: str | None
    interpreted: bool
    backward: bool
    compiled: bool
    upstream: bool


def impl_statuses(device: str) -> list[ImplStatus]:
    """Every registered op's impls and whether each runs on `device` ("cpu", "cuda", "cuda:1")."""
    statuses = []
    for op in all_ops():
        for name, impl in op.impls.items():
            flags = (impl.backward, impl.compiled, impl.upstream)
            statuses.append(ImplStatus(op.name, name, impl.unavailable(device), interpreted(impl, device), *flags))
    return statuses


def case_memory(
    op: Op, shape: Shape, dtype: torch.dtype, options: dict | None = None, reference: bool = True, pieces: bool = False
) -> int:
    """Bytes a case needs: its inputs and outputs in `dtype` (`bytes_moved`) and (reference) the float64 reference's:
    counted twice for the temporaries of a reference made whole; with `pieces`, where the op allows it (`Reference`:
    an op whose case's shape is that of its input and output), one more of the input's size (the float32 reference
    kept for 4-byte inputs; for 16-bit ones, the float32 draw they are made from) and the pieces in flight."""
    options = options or {}
    need = op.bytes_moved(shape, dtype, **options)
    if not reference:
        return need
    if pieces and in_pieces(op, shape):
        return need + math.prod(shape) * dtype.itemsize + PIECES_IN_FLIGHT * REFERENCE_PIECE_BYTES
    return need + 2 * op.bytes_moved(shape, torch.float64, **options)


def refuse_if_too_big(
    op: Op,
    shape: Shape,
    dtype: torch.dtype,
    device: str,
    options: dict | None = None,
    reference: bool = True,
    pieces: bool = False,
) -> None:
    """Raise TooBig, saying what the case needs (`case_memory`), when that is more than the device's free memory."""
    free = free_bytes(device)
    need = case_memory(op, shape, dtype, options, reference, pieces)
    if free is not None and need > free:
        what = "inputs, outputs and the float64 reference" if reference else "inputs and outputs"
        raise TooBig(
            f"{format_shape(shape)} needs about {format_bytes(need)} ({what}), {format_bytes(free)} free on {device}"
        )


def refuse_if_nothing_fits(
    op: Op,
    shapes: Sequence[Shape],
    dtypes: Sequence[torch.dtype],
    device: str,
    options: Sequence[dict],
    pieces: bool = False,
) -> None:
    """Raise TooBig, naming the case that needs least, when no case of shapes x dtypes x options fits in the device's
    free memory (`refuse_if_too_big`), so that a command refuses before it runs anything."""
    refusals: list[tuple[int, TooBig]] = []
    for shape, dtype, opts in itertools.product(shapes, dtypes, options):
        try:
            refuse_if_too_big(op, shape, dtype, device, opts, pieces=pieces)
        except TooBig as exc:
            refusals.append((case_memory(op, shape, dtype, opts, pieces=pieces), exc))
        else:
            return
    if refusals:
        raise TooBig(f"refused before allocating: {min(refusals, key=lambda r: r[0])[1]}")


def relative_error(out: torch.Tensor, ref: torch.Tensor, piece_rows: int | None = None) -> float:
    """||out - ref|| / ||ref|| over finite reference entries (float64).

    Non-finite reference entries must be matched exactly (same NaN, same signed inf), else the error is inf.
    A shape mismatch is inf. An all-zero reference gives the absolute error. piece_rows: add it up this many rows
    (along the first dimension) at a time, so no float64 copy of the whole is made.
    """
    if out.shape != ref.shape:
        return float("inf")
    if piece_rows is None or out.dim() == 0 or out.shape[0] == 0:
        return _error([_error_sums(out, ref)])
    sums = [_error_sums(out[i : i + piece_rows], ref[i : i + piece_rows]) for i in range(0, out.shape[0], piece_rows)]
    return _error(sums)


def _error_sums(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """(||out - ref||^2, ||ref||^2) over the finite entries of ref, in float64; (inf, 0) where a non-finite entry
    differs, or out is not finite where ref is, or the shapes differ."""
    if out.shape != ref.shape:
        return math.inf, 0.0
    o = out.detach().to(torch.float64)
    r = ref.detach().to(device=o.device, dtype=torch.float64)
    finite = torch.isfinite(r)
    if not bool(finite.all()):
        bad = ~finite
        same_nan = torch.isnan(r[bad]) & torch.isnan(o[bad])
        same_inf = r[bad] == o[bad]
        if not bool((same_nan | same_inf).all()):
            return math.inf, 0.0
        o, r = o[finite], r[finite]
    if not bool(torch.isfinite(o).all()):
        return math.inf, 0.0
    return torch.linalg.vector_norm(o - r).item() ** 2, torch.linalg.vector_norm(r).item() ** 2


def _error(sums: Sequence[tuple[float, float]]) -> float:
    """The relative error from the (diff^2, ref^2) sums of its pieces."""
    if any(math.isinf(d) for d, _ in sums):
        return float("inf")
    diff, norm = math.sqrt(sum(d for d, _ in sums)), math.sqrt(sum(n for _, n in sums))
    return diff / norm if norm > 0 else diff


REFERENCE_PIECE_BYTES = 2**23  # a reference computed in pieces: about this many float64 input bytes at a time
PIECES_IN_FLIGHT = 16  # what the pieces hold at once, in REFERENCE_PIECE_BYTES: input, reference, temporaries, error
# (and what the allocator keeps of them)


def in_pieces(op: Op, shape: Shape) -> bool:
    """Whether the op's reference of a case of `shape` may be made a slice of rows at a time (`Defaults.rows_from`)."""
    least = op.defaults.rows_from
    return least is not None and len(shape) >= max(least, 1) and shape[0] > 0


def reference_rows(op: Op, inputs: Sequence[torch.Tensor]) -> int | None:
    """Rows of the inputs per piece of the reference (`Defaults.rows_from`), or None: all at once."""
    if not in_pieces(op, tuple(inputs[0].shape)):
        return None
    row_bytes = sum(t[0].numel() for t in inputs) * 8
    return max(1, REFERENCE_PIECE_BYTES // max(row_bytes, 1))


def reference_of(op: Op, inputs: Sequence[torch.Tensor], options: dict, rows: int | None) -> torch.Tensor:
    """The op's float64 reference of `inputs`: at once (rows None), or `rows` at a time, kept in float32 or the
    inputs' dtype if wider (float32 keeps 1e-7 of it, two orders below any tolerance, at half the memory)."""
    if rows is None:
        return op.reference(*(x.to(torch.float64) for x in inputs), **options)
    n = inputs[0].shape[0]
    keep = torch.promote_types(inputs[0].dtype, torch.float32)
    ref: torch.Tensor | None = None
    for i in range(0, n, rows):
        piece = op.reference(*(x[i : i + rows].to(torch.float64) for x in inputs), **options)
        if ref is None:
            ref = torch.empty((n, *piece.shape[1:]), dtype=keep, device=piece.device)
        ref[i : i + rows] = piece
    return ref


class Reference:
    """The float64 reference of one case's inputs, to measure each impl's output against (`error`).

    Made whole where the op does not declare rows (`Defaults.rows_from`); else a piece of rows at a time, and kept in
    float32 (or wider) only where that is no larger than the inputs (4-byte dtypes and wider). For 16-bit inputs a
    float32 copy would be twice their size, so each output is measured against the reference remade piece by piece
    beside it. A case then needs its inputs, one output and at most their size again (plus the pieces in flight):
    at most about 3x its input (`case_memory`)."""

    def __init__(self, op: Op, inputs: Sequence[torch.Tensor], options: dict) -> None:
        self.op, self.inputs, self.options = op, inputs, options
        self.rows = reference_rows(op, inputs)
        dtype = inputs[0].dtype
        keep = self.rows is None or torch.promote_types(dtype, torch.float32).itemsize <= dtype.itemsize
        self.kept = reference_of(op, inputs, options, self.rows) if keep else None

    def error(self, out: torch.Tensor) -> float:
        """||out - ref|| / ||ref|| (`relative_error`), a piece at a time where the reference is made in pieces."""
        if self.kept is not None:
            return relative_error(out, self.kept, self.rows)
        n, rows = self.inputs[0].shape[0], self.rows
        if out.dim() == 0 or out.shape[0] != n:
            return float("inf")
        sums = []
        for i in range(0, n, rows):
            piece = self.op.reference(*(x[i : i + rows].to(torch.float64) for x in self.inputs), **self.options)
            sums.append(_error_sums(out[i : i + rows], piece))
            del piece
        return _error(sums)


def gradient_error(
    grads: Sequence[torch.Tensor], refs: Sequence[torch.Tensor], scales: Sequence[float] | None = None
) -> float:
    """The worst input's gradient error: ||g - ref|| / ||ref|| per input, where an input's reference gradient is
    smaller than its share of the whole gradient (||all refs|| * sqrt(its numel / all numel)) measured against that
    share instead. Some gradients are zero by the math (attention's dQ and dK when each query sees one key): their
    own norm is rounding, and dividing by it turns 1e-7 of noise into a relative error of 1e24.
    scales: per input, a larger norm to measure against where the op's gradient cancels bigger terms
    (`Op.gradient_scale`)."""
    norms = [torch.linalg.vector_norm(r.detach().to(torch.float64)).item() for r in refs]
    total = sum(n * n for n in norms) ** 0.5
    numel = sum(r.numel() for r in refs) or 1
    worst = 0.0
    for i, (g, r, norm) in enumerate(zip(grads, refs, norms, strict=True)):
        floor = max(total * (r.numel() / numel) ** 0.5, scales[i] if scales else 0.0)
        err = relative_error(g, r)  # ||g - ref|| / ||ref|| (the absolute error where ||ref|| is 0)
        if norm < floor and math.isfinite(err):
            err *= (norm or 1.0) / floor
        worst = max(worst, err)
    return worst


def poison_allocator(nbytes: int, device: str | torch.device, blocks: int = 16) -> None:
    """Fill memory that the next allocations will likely reuse with NaN, so unwritten outputs show as NaN.

    Several blocks of the output's size are poisoned, since the allocator may hand out any recently freed block
    of that size (the CUDA caching allocator reuses deterministically; CPU malloc less so: best effort).
    """
    if nbytes > 0:
        blocks = max(1, min(blocks, POISON_BYTES // nbytes))  # outputs of GiBs: fewer blocks, not 16 x the output
        poisoned = [torch.full((max(nbytes // 4, 1),), float("nan"), device=device) for _ in range(blocks)]
        del poisoned


def option_grid(op: Op, options: dict[str, object] | None) -> list[dict[str, object]]:
    """Every combination of the op's options, or just the one given (validated)."""
    if options:
        return [op.resolve_options(options)]
    keys = list(op.options)
    sweeps = (op.options[k].sweep for k in keys)
    return [dict(zip(keys, values, strict=True)) for values in itertools.product(*sweeps)]


def prepare(impl: Impl, device: str, dtype: torch.dtype | None = None) -> Callable[..., torch.Tensor]:
    """The callable to run: the impl's fn, or a fresh watched torch.compile of it for compiled impls."""
    reason = impl.unavailable(device, dtype)
    if reason:
        raise Unavailable(reason)
    return WatchedCompile(impl.fn) if impl.compiled else impl.fn


def fresh_seed() -> int:
    return int.from_bytes(os.urandom(4), "little")


# ---------------------------------------------------------------------------------------------- check


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

    layout: the inputs' memory layout (fuselab.bench.shapes.apply_layout: contiguous, transposed, sliced, expanded).
    """
    fn = prepare(impl, device, dtype)
    inputs = tuple(apply_layout(x, layout) for x in op.make_inputs(shape, dtype, device, seed, **options))
    ref = op.reference(*(x.to(torch.float64) for x in inputs), **options)
    poison_allocator(ref.numel() * inputs[0].element_size(), device)
    out = fn(*inputs, **options)
    if out.dtype != inputs[0].dtype:
        raise TypeError(f"{impl.name} returned {dtype_name(out.dtype)} for {dtype_name(inputs[0].dtype)} input")
    row: dict[str, object] = {"rel_err": relative_error(out, ref), "grad_rel_err": None}
    if grad and impl.backward and shape and all(shape):
        gen = torch.Generator(device="cpu").manual_seed(seed + 1)
        dy = torch.randn(ref.shape, generator=gen, dtype=torch.float64).to(device)
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
    *,
    impls: Sequence[str] | None = None,
    dtypes: Sequence[torch.dtype] | None = None,
    shapes: Sequence[Shape] | None = None,
    options: dict[str, object] | None = None,
    device: str | None = None,
    seed: int | None = None,
    show_progress: bool = True,
    layout: str = "contiguous",
    grad: bool = True,
    refuse_early: bool = False,
) -> list[CheckRow]:
    """A CheckRow (its Case, rel_err, grad_rel_err, tolerance, status, reason, seed) for every combination.

    status: "pass", "FAIL" (error over tolerance, or an exception), "unavailable" or "refused" (with the reason).
    Triton under the CPU interpreter is checked in float32 only (the interpreter is weak below fp32).
    layout: the inputs' memory layout (`check_case`); rows of a layout other than contiguous carry it.
    grad: check gradients too, where the impl has a backward.
    refuse_early: when no case fits in the device's free memory, raise TooBig (`refuse_if_nothing_fits`) before any
    work instead of returning refused rows.
    """
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    names = list(impls or op.impls)
    for name in names:
        op.get_impl(name)  # unknown names fail before any work
    dtypes = list(dtypes or op.dtypes)
    seed = fresh_seed() if seed is None else seed
    shapes = shapes or op.defaults.check_shapes
    if refuse_early:
        refuse_if_nothing_fits(op, shapes, dtypes, device, option_grid(op, options))
    cases = [
        Case.of(op.name, name, dtype, shape, opts, layout=layout, pass_=None)
        for name in names
        for dtype in dtypes
        for shape in shapes
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
            refuse_if_too_big(op, shape, dtype, device, opts)
            row = check_case(op, impl, shape, dtype, device, opts, case_seed, grad, layout)
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


# ---------------------------------------------------------------------------------------------- bench


def bench_case(
    op: Op,
    impls: Sequence[Impl],
    shape: Shape,
    dtype: torch.dtype,
    device: str,
    options: dict,
    timing: Timing,
    rounds: int = 5,
    backward: bool = False,
    call_cost_ms: float = 100.0,
    layout: str = "contiguous",
) -> dict[str, dict | Exception]:
    """Time the impls of one case on one fresh input, taking turns over `rounds` rounds (`benchmark_side_by_side`;
    CUDA-graph timing runs them one after the other). Per impl: its row (speed, and its error against the reference
    on the same input), or the exception that stopped it. An exception while timing stops them all.

    call_cost_ms: time per impl for `call_cost` (host us/call and end-to-end us/call of back-to-back calls); 0: none.
    backward: time forward + backward (torch.autograd.grad of the output against a fixed random gradient, so nothing
    accumulates); impls without a backward are left out. A compute-bound op on a GPU is also timed back to back
    (`sustained_ms`: calls queued one after another, no flush, as do_bench and the papers time them) beside the
    rested default (each call from an idle, flushed GPU), since clocks under a power limit differ between the two.
    layout: the inputs' memory layout (fuselab.bench.shapes.apply_layout: contiguous, transposed, sliced, expanded).
    """
    results: dict[str, dict | Exception] = {}
    for impl in impls:  # impls that cannot or need not run here are left out before any input is made
        reason = impl.unavailable(device, dtype)
        if not reason and backward and not impl.backward:
            reason = f"{impl.name} has no backward"
        if reason or interpreted(impl, device):
            results[impl.name] = Unavailable(reason) if reason else Skipped(INTERPRETER_SKIP)
    if len(results) == len(impls):
        return results
    inputs = tuple(apply_layout(x, layout) for x in op.make_inputs(shape, dtype, device, fresh_seed(), **options))
    try:
        ref: Reference | None = Reference(op, inputs, options)
    except torch.OutOfMemoryError:  # a float64 reference too large for the device (attention's N x N scores at 16k)
        ref = None
        torch.cuda.empty_cache()
    fns: dict[str, Callable[..., torch.Tensor]] = {}
    for impl in impls:
        if impl.name in results:
            continue
        try:
            fn = prepare(impl, device)
            out = fn(*inputs, **options)
            results[impl.name] = {"rel_err": _error_of(ref, out)}
            del out  # before the next impl's output is made
            if results[impl.name]["rel_err"] is None:
                results[impl.name]["warnings"] = [REFERENCE_TOO_BIG]
            fns[impl.name] = fn
        except Exception as exc:  # this impl fails alone; the others are still timed
            results[impl.name] = exc
            if isinstance(exc, torch.OutOfMemoryError):
                torch.cuda.empty_cache()
    del ref
    calls = {name: _call(fn, inputs, options, backward) for name, fn in fns.items()}
    try:
        measured = benchmark_side_by_side(calls, rounds=rounds, device=device, timing=timing)
        sustained = (
            back_to_back(calls, device=device, timing=timing)
            if op.bound == "compute" and torch.device(device).type == "cuda"
            else {}
        )
    except Exception as exc:
        return {name: exc if name in fns else result for name, result in results.items()}
    cost_options = {**options, "backward": True} if backward else options
    nbytes, flops = op.case_cost(shape, dtype, cost_options)
    for name, m in measured.items():
        seconds = m.median_ms * 1e-3
        row = results[name]
        notes = row.pop("warnings", [])
        row.update(m.summary(), numel=inputs[0].numel(), bytes=nbytes, flops=flops, bound=op.bound)
        row["warnings"] = [*row["warnings"], *notes]
        if name in sustained:
            row["sustained_ms"] = sustained[name]
            row["sustained_tflops"] = flops / (sustained[name] * 1e-3) / 1e12 if sustained[name] > 0 else None
        row["gbps"] = nbytes / seconds / 1e9 if seconds > 0 else None
        row["tflops"] = flops / seconds / 1e12 if seconds > 0 else None
        fn = fns[name]
        if isinstance(fn, WatchedCompile):
            row.update(compile_s=fn.compile_s, compile_graphs=fn.graphs, compile_flags=fn.flags)
            row["warnings"] = [*row["warnings"], *fn.flags]
        if call_cost_ms > 0:
            row.update(call_cost(calls[name], device=device, budget_ms=call_cost_ms).summary())
    return results


def _error_of(ref: Reference | None, out: torch.Tensor) -> float | None:
    """out's error against the reference; None where the reference does not fit in the device's memory."""
    if ref is None:
        return None
    try:
        return ref.error(out)
    except torch.OutOfMemoryError:  # a piece remade beside the output did not fit
        torch.cuda.empty_cache()
        return None


def _call(
    fn: Callable[..., torch.Tensor], inputs: Sequence[torch.Tensor], options: dict, backward: bool
) -> Callable[[], object]:
    """What one timed call runs: the forward, or forward + backward (gradients of every floating input against one
    fixed random output gradient, returned rather than accumulated)."""
    if not backward:
        return functools.partial(fn, *inputs, **options)
    leaves = [x.detach().requires_grad_(x.is_floating_point()) for x in inputs]
    wanted = [x for x in leaves if x.requires_grad]
    with torch.no_grad():
        probe = fn(*leaves, **options)
    grad = torch.randn_like(probe)

    def step() -> object:
        return torch.autograd.grad(fn(*leaves, **options), wanted, grad)

    return step


def back_to_back(
    calls: dict[str, Callable[[], object]], *, device: str, timing: Timing, rounds: int = 3
) -> dict[str, float]:
    """{name: median ms per call} of each callable queued back to back (no L2 flush, no idle gap between calls),
    timed with CUDA events over bursts of about timing.rep_ms / rounds, the callables taking turns."""
    samples: dict[str, list[float]] = {name: [] for name in calls}
    per_call: dict[str, float] = {}
    for name, call in calls.items():  # one synced call each, to size the bursts
        torch.cuda.synchronize(device)
        start = time.perf_counter()
        call()
        torch.cuda.synchronize(device)
        per_call[name] = max((time.perf_counter() - start) * 1e3, 1e-3)
    for _ in range(rounds):
        for name, call in calls.items():
            n = max(3, min(200, int(timing.rep_ms / rounds / per_call[name])))
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            call()  # one call ahead, so the burst starts with the GPU busy
            begin.record()
            for _ in range(n):
                call()
            end.record()
            end.synchronize()
            samples[name].append(begin.elapsed_time(end) / n)
    return {name: statistics.median(values) for name, values in samples.items()}


def bench_op(
    op: Op,
    *,
    impls: Sequence[str] | None = None,
    dtypes: Sequence[torch.dtype] | None = None,
    shapes: Sequence[Shape] | None = None,
    options: dict[str, object] | None = None,
    device: str | None = None,
    out: str | Path | None = None,
    timing: Timing | dict | None = None,
    rounds: int = 5,
    layout: str = "contiguous",
    show_progress: bool = True,
    passes: Sequence[str] = ("forward",),
    call_cost_ms: float = 100.0,
    max_call_ms: float | None = None,
    slow_before: Sequence[Row] = (),
    refuse_early: bool = False,
) -> list[Row]:
    """Sweep impls x dtypes x shapes (x option values) x passes, one Row per case, appended to `out` (JSON lines).

    The impls of one case are timed together on the same input, taking turns over `rounds` rounds, so the ratios
    between them are not at the mercy of what drifts (clocks under a power limit, temperature). A resumed sweep times
    only the impls its log lacks (their ratios are then against rows timed in the earlier run). Rows carry the
    environment, median/IQR (ms), GB/s, TFLOP/s, % of the measured copy ceiling and of a copy of the same bytes timed
    after the sweep, the speed-up against the op's baseline impl, and the error against the reference.
    timing: how each impl is timed (a `fuselab.bench.Timing`, or a mapping of its fields; None: its defaults).
    passes: "forward" and/or "forward+backward" (each case's `pass`; the cost model is asked for the backward's
    bytes and FLOPs with backward=True).
    call_cost_ms > 0 adds the host's cost of a call and the end-to-end time of back-to-back calls (host_us, e2e_us).
    layout: the inputs' memory layout (`bench_case`); rows of a layout other than contiguous carry it.
    max_call_ms: an impl whose median call took longer at one case is not timed at the sweep's costlier cases of the
    same dtype, options and pass (`CallCap`): their rows are skipped, saying why (None: every case is timed).
    slow_before: rows of earlier sweeps (of the same op) whose slow calls keep their impls out of this sweep's
    costlier cases too, as a resumed sweep's own log does.
    refuse_early: when no case fits in the device's free memory, raise TooBig (`refuse_if_nothing_fits`) before any
    work (nothing logged) instead of returning refused rows.
    """
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    timing = Timing.of(timing)
    unknown = [p for p in passes if p not in PASSES]
    if unknown or not passes:
        raise ValueError(f"unknown pass {unknown or passes}; accepted: {', '.join(PASSES)}")
    names = list(impls or op.impls)
    for name in names:
        op.get_impl(name)
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    dtypes = list(dtypes or [torch.float32, torch.bfloat16])
    if refuse_early:
        refuse_if_nothing_fits(op, shapes or op.defaults.bench_shapes, dtypes, device, option_grid(op, options), True)
    # Case-major, impl fastest: the log is written in the order the impls were measured.
    cap = CallCap(op, max_call_ms)
    shapes = cap.cheapest_first(shapes or op.defaults.bench_shapes, dtypes[0], op.resolve_options(options))
    cases = [
        Case.of(op.name, name, dtype, shape, opts, layout=layout, pass_=pass_)
        for dtype in dtypes
        for shape in shapes
        for opts in option_grid(op, options)
        for pass_ in passes
        for name in names
    ]
    ceilings = ceilings_mod.get_ceilings(device)
    copy_gbps = ceilings["copy_gbps"] if ceilings else None
    measured: dict[str, dict[str, dict | Exception]] = {}  # one case's impls, timed together at its first impl
    finished: set[str] = set()  # cases of the log, not timed again on resume

    def run(case: Case) -> dict:
        together = case.peer_key
        if together not in measured:
            try:
                refuse_if_too_big(op, case.shape, case.torch_dtype, device, case.option_values, pieces=True)
            except TooBig as exc:
                measured[together] = dict.fromkeys(names, exc)
                raise
            capped = {n: cap.reason(case.with_impl(n)) for n in names}
            measured[together] = {n: Skipped(why) for n, why in capped.items() if why}
            pending = [n for n in names if not capped[n] and case.with_impl(n).key not in finished]
            measured[together] |= bench_case(
                op,
                [op.get_impl(n) for n in pending],
                case.shape,
                case.torch_dtype,
                device,
                case.option_values,
                timing,
                rounds,
                backward=case.backward,
                call_cost_ms=call_cost_ms,
                layout=layout,
            )
            for name, result in measured[together].items():
                if isinstance(result, dict):
                    cap.note(Row.from_json({**case.with_impl(name).to_json(), **result}, op.options))
        result = measured[together][case.impl]
        if isinstance(result, Exception):
            raise result
        return {**result, **row_provenance(device)}

    spread = {"cost": sweep_cost(op, timing), "group": lambda case: case.peer_key}  # over GPUs under torchrun
    with Sweep(cases, out, description=f"bench {op.name}", show_progress=show_progress, **spread) as sweep:
        logged = [Row.from_json(r, op.options) for r in sweep.done.values()]
        for row in [*slow_before, *logged]:  # an earlier sweep's or a resumed sweep's slow impls stay out
            cap.note(row)
        finished.update(row.case.key for row in logged)
        for case in sweep:
            with sweep.running(case) as outcome:
                outcome.update(run(case))
    typed = [Row.from_json(r, op.options) for r in sweep.rows]
    same_size = {}
    if op.bound == "memory":  # a copy of the same bytes, timed once per size: what such a size can reach
        sizes = sorted({r.bytes for r in typed if r.measured and r.bytes})
        same_size = {b: ceilings_mod.copy_gbps_at(b, device, timing) for b in sizes}
    typed = add_derived(typed, op.defaults.baseline, copy_gbps, same_size)
    rows = [with_peak(r, ceilings) for r in typed]
    busy = ceilings_mod.busy_note(ceilings)
    if busy:  # ceilings timed beside other work: every % of them reads high
        rows = [r.updated(warnings=(*r.warnings, busy)) if r.measured else r for r in rows]
    return rows


def with_peak(row: Row, ceilings: dict | None) -> Row:
    """The row with pct_peak: its TFLOP/s as % of the measured matmul rate of its dtype; past ABOVE_CEILING_PCT of
    it, a warning saying so (a compute-bound op's; a memory-bound op's FLOPs are not held to the peak)."""
    peak = ceilings_mod.peak_tflops(ceilings, row.case.dtype)
    if not row.measured or not peak or row.tflops is None:
        return row
    row = row.updated(pct_peak=100 * row.tflops / peak)
    if "pct_peak" in past_ceilings(row):
        row = row.updated(warnings=(*row.warnings, ceiling_warning(row.pct_peak, "pct_peak")))
    return row


class CallCap:
    """A sweep's bound on time: an impl whose median call took longer than `max_ms` at one case is not timed at the
    sweep's cases of the same op, dtype, layout, options and pass that cost more (FLOPs for a compute-bound op, bytes
    moved for a memory-bound one): a teaching impl (a Python loop over blocks) would only take longer there, and
    one sweep's time stays bounded whatever the impls. max_ms None: no bound."""

    def __init__(self, op: Op, max_ms: float | None) -> None:
        self.op, self.max_ms = op, max_ms
        self.over: dict[tuple[str, str], tuple[float, float, list[int]]] = {}  # (impl, kind): (cost, ms, shape)

    def _kind(self, case: Case) -> str:
        return dataclasses.replace(case, impl="", shape=()).key  # the same op, dtype, layout, options and pass

    def _cost(self, case: Case) -> float:
        nbytes, flops = self.op.case_cost(case.shape, case.torch_dtype, case.option_values)
        return float(flops if self.op.bound == "compute" else nbytes)

    def cheapest_first(self, shapes: Sequence[Shape], dtype: torch.dtype, options: dict) -> list[Shape]:
        """`shapes` in the order to time them: as given without a bound; with one, cheapest first (at `dtype` and
        `options`; ties keep their order), so an impl's slow call is met at the smallest case it can be."""
        if self.max_ms is None:
            return list(shapes)

        def cost(shape: Shape) -> float:
            try:
                return self._cost(Case.of(self.op.name, "", dtype, shape, options))
            except Exception:  # a shape the cost model refuses is refused, with the reason, when its turn comes
                return 0.0

        return sorted(shapes, key=cost)

    def note(self, row: Row) -> None:
        """Remember a measured row whose call took over the bound."""
        ms = row.median_ms
        if self.max_ms is None or row.status is not Status.OK or not isinstance(ms, float) or ms <= self.max_ms:
            return
        key, cost = (row.case.impl, self._kind(row.case)), self._cost(row.case)
        if key not in self.over or cost < self.over[key][0]:
            self.over[key] = (cost, ms, list(row.case.shape))

    def reason(self, case: Case) -> str | None:
        """Why `case` is not timed (None: it is)."""
        seen = self.over.get((case.impl, self._kind(case)))
        if seen is None or self._cost(case) <= seen[0]:
            return None
        _, ms, shape = seen
        return (f"not timed: {ms:.0f} ms a call already at {format_shape(tuple(shape))}, a smaller case, over the "
                f"{self.max_ms:g} ms a call this sweep allows")  # fmt: skip


def sweep_cost(op: Op, timing: Timing | None = None) -> Callable[[Case], float]:
    """A case's estimated seconds, for spreading a sweep over GPUs: its impl's timing budget (none for a check), a
    compile if the impl is compiled, and its bytes and FLOPs (see fuselab.bench.distributed.case_cost)."""
    timing_s = (timing.warmup_ms + timing.rep_ms) / 1e3 if timing else 0.0

    def cost(case: Case) -> float:
        impl = op.impls.get(case.impl)
        try:
            nbytes, flops = op.case_cost(case.shape, case.torch_dtype, case.option_values)
        except Exception:  # a cost model that cannot say: size counts for nothing
            nbytes, flops = 0, 0
        compiled = int(bool(impl and impl.compiled))
        return distributed.case_cost(timing_s=timing_s or 0.05, compiled=compiled, nbytes=nbytes, flops=flops)

    return cost


ABOVE_CEILING_PCT = 110.0  # a rate past this % of a ceiling (copy, a copy of the same size, the matmul peak): flagged
ABOVE_CEILING_NOTE = (
    "the copy ceiling: faster than memory allows, so the data stayed in a cache (a small size, or inputs reused) or "
    "the time is wrong"
)
ABOVE_PEAK_NOTE = (
    "the matmul ceiling: faster than this device multiplies in its dtype, so the ceiling was measured low (a busy "
    "CPU, a cold clock) or the time or the FLOP count is wrong"
)
CEILING_SHARES = {"pct_copy": ABOVE_CEILING_NOTE, "pct_copy_same": ABOVE_CEILING_NOTE, "pct_peak": ABOVE_PEAK_NOTE}


def past_ceilings(row: Row) -> dict[str, float]:
    """{field: %} of the row's shares of a ceiling that pass ABOVE_CEILING_PCT: pct_copy and pct_copy_same, and a
    compute-bound row's pct_peak (a memory-bound op's FLOPs are not held to the matmul peak)."""
    shares = {"pct_copy": row.pct_copy, "pct_copy_same": row.pct_copy_same}
    shares["pct_peak"] = row.pct_peak if row.bound == "compute" else None
    return {name: pct for name, pct in shares.items() if pct is not None and pct > ABOVE_CEILING_PCT}


def above_ceiling(row: Row) -> tuple[float, str] | None:
    """(%, field) of the row's largest share of a ceiling where it passes ABOVE_CEILING_PCT, else None."""
    past = past_ceilings(row)
    if not past:
        return None
    name = max(past, key=past.__getitem__)
    return past[name], name


def ceiling_warning(pct: float, share: str) -> str:
    """What a row's warnings say of its share `share` (a CEILING_SHARES field) at `pct` % of its ceiling."""
    return f"{pct:.0f}% of {CEILING_SHARES[share]}"


def add_derived(
    rows: Sequence[Row],
    baseline: str,
    copy_gbps: float | None,
    same_size_copy: dict[int, float] | None = None,
) -> list[Row]:
    """The rows with pct_copy (GB/s as % of the copy ceiling), speedup against `baseline` (its median / this median
    on the same case) and, given same_size_copy ({bytes moved: GB/s of a copy moving as many}), copy_same_gbps and
    pct_copy_same. A row past ABOVE_CEILING_PCT of either gets a warning saying so."""
    base = {r.case.peer_key: r.median_ms for r in rows if r.case.impl == baseline and r.measured}
    out = []
    for row in rows:
        if not row.measured:
            out.append(row)
            continue
        same = (same_size_copy or {}).get(row.bytes) if row.bytes else None
        row = row.updated(
            pct_copy=100 * row.gbps / copy_gbps if copy_gbps and row.gbps else None,
            copy_same_gbps=same,
            pct_copy_same=100 * row.gbps / same if same and row.gbps else None,
        )
        copy = {name: pct for name, pct in past_ceilings(row).items() if name != "pct_peak"}  # the peak: with_peak
        if copy:
            row = row.updated(warnings=(*row.warnings, ceiling_warning(max(copy.values()), "pct_copy")))
        reference_ms = base.get(row.case.peer_key)
        out.append(row.updated(baseline=baseline, speedup=reference_ms / row.median_ms if reference_ms else None))
    return out


# ---------------------------------------------------------------------------------------------- every shape


def load_of(
    op: Op,
    dtype: torch.dtype = torch.float32,
    options: dict | None = None,
    *,
    max_bytes: float | None = None,
    max_flops: float | None = None,
) -> Callable[[Shape], float] | None:
    """The share of a cap a shape takes, by the op's cost model at `dtype` and `options`: the larger of bytes moved /
    max_bytes and FLOPs / max_flops (1.0: at the cap). None without a cap."""
    if max_bytes is None and max_flops is None:
        return None
    opts = op.resolve_options(options)

    def load(shape: Shape) -> float:
        nbytes, flops = op.case_cost(shape, dtype, opts)
        return max(nbytes / max_bytes if max_bytes else 0.0, flops / max_flops if max_flops else 0.0)

    return load


def draw_op_shapes(
    op: Op,
    n: int,
    seed: int,
    *,
    max_bytes: float | None = None,
    max_flops: float | None = None,
    dtype: torch.dtype = torch.float32,
    options: dict | None = None,
) -> list[Shape]:
    """n shapes from the op's `random_shape`, reproducibly from `seed`; with a cap (bytes moved, FLOPs per call, by
    the op's cost model), a draw above it has its first dimension cut to fit (`draw_shapes`)."""
    if op.defaults.random_shape is None:
        raise ValueError(f"op {op.name!r} has no random_shape in its spec, so no shapes can be drawn for it")
    load = load_of(op, dtype, options, max_bytes=max_bytes, max_flops=max_flops)
    return draw_shapes(op.defaults.random_shape, n, seed, load=load)


def shape_ratios(op: Op, rows: Sequence[Row], by: Sequence[str] = ()) -> tuple[list[Row], list[dict]]:
    """The bench rows with their ratio to the fastest of the op's peers on the same case (`add_ratios`: `ratio`,
    `best_peer`), and per impl, dtype and the fields `by` the worst ratio, the 95th percentile, the geometric mean
    and the five worst shapes (`summarize`)."""
    rows = add_ratios(rows, op.defaults.peers)
    return rows, summarize(rows, ("impl", "dtype", *by))


# ---------------------------------------------------------------------------------------------- the cost of a call

GPU_BOUND_FACTOR = 1.2  # end to end per call within this factor of the device time: the GPU, not the host, sets it
GROWTH_FACTOR = 2.0  # on the CPU: time per call at least this many times the smallest size's: the work, not the call


def ladder_shapes(
    op: Op,
    *,
    min_bytes: float,
    max_bytes: float,
    factor: float = 4.0,
    max_flops: float | None = None,
    dtype: torch.dtype = torch.float32,
    options: dict | None = None,
) -> list[Shape]:
    """Shapes from tiny to large for the cost of a call: the op's profile shape grown or shrunk (`size_ladder`) so it
    moves min_bytes, min_bytes * factor, ... up to max_bytes (the op's cost model), those above max_flops left out."""
    opts = op.resolve_options(options)

    def nbytes(shape: Shape) -> float:
        return op.case_cost(shape, dtype, opts)[0]

    shapes = size_ladder(op.default_profile_shape(), nbytes, min_bytes, max_bytes, factor)
    return [s for s in shapes if max_flops is None or op.case_cost(s, dtype, opts)[1] <= max_flops]


def call_cost_row(row: Row) -> dict:
    """A bench row (bench_op with call_cost_ms > 0) as a cost-of-a-call row: device time per call in us beside the
    host's and the end-to-end time of back-to-back calls."""
    out = {
        "op": row.case.op,
        "impl": row.case.impl,
        "dtype": row.case.dtype,
        "shape": list(row.case.shape),
        **{k: row.field(k) for k in ("numel", "bytes", "flops", "host_us", "e2e_us", "host_bound", "error")},
    }
    out["mode"] = "eager"
    out["device_us"] = row.median_ms * 1e3 if row.median_ms is not None else None
    if row.error:
        out["status"] = str(row.status)
    return out


def compiled_call_cost(
    op: Op,
    impl_name: str,
    mode: str,
    shapes: Sequence[Shape],
    *,
    dtype: torch.dtype,
    device: str,
    options: dict | None = None,
    timing: Timing | None = None,
    budget_ms: float = 50.0,
) -> list[dict]:
    """The cost of a call of `impl_name` under torch.compile(mode=mode, dynamic=True) (one compile for every shape;
    "reduce-overhead" captures a CUDA graph per shape), one row per shape as `call_cost_row`: device time
    (`benchmark`), host and end-to-end us per call (`call_cost`), or the error that stopped it."""
    impl = op.get_impl(impl_name)
    opts = op.resolve_options(options)
    reason = impl.unavailable(device) or (
        "compiled already: torch.compile of it is its own impl" if impl.compiled else ""
    )
    torch._dynamo.reset()
    fn = torch.compile(lambda *xs: impl.fn(*xs, **opts), mode=mode, dynamic=True)
    rows = []
    for shape in shapes:
        nbytes, flops = op.case_cost(shape, dtype, opts)
        row = {"op": op.name, "impl": impl_name, "mode": mode, "dtype": dtype_name(dtype), "shape": list(shape)}
        row.update(bytes=nbytes, flops=flops, numel=None, device_us=None, host_us=None, e2e_us=None, error=None)
        if reason:
            rows.append({**row, "error": reason, "status": Status.UNAVAILABLE.value})
            continue
        try:
            inputs = op.make_inputs(shape, dtype, device, fresh_seed(), **opts)
            call = functools.partial(fn, *inputs)
            with torch.no_grad():  # forward only, as the eager rows (no input asks for a gradient)
                call()  # compiles (once; reduce-overhead records a graph per shape)
                measured = benchmark(call, device=device, timing=timing)
                cost = call_cost(call, device=device, budget_ms=budget_ms)
            row.update(numel=inputs[0].numel(), device_us=measured.median_ms * 1e3, **cost.summary())
        except Exception as exc:  # this mode fails at this size alone; the rest go on
            row.update(error=f"{type(exc).__name__}: {exc}"[:500], status=Status.ERROR.value)
            if isinstance(exc, torch.OutOfMemoryError):
                torch.cuda.empty_cache()
        rows.append(row)
    torch._dynamo.reset()
    return rows


def bound_from(rows: Sequence[dict], on_gpu: bool) -> dict | None:
    """Of one impl's rows (one mode, sizes ascending by bytes): the first from which every larger one is
    - on a GPU, GPU-bound: end to end per call within GPU_BOUND_FACTOR of the device time;
    - on the CPU, growing: end to end per call at least GROWTH_FACTOR times the smallest size's (the fixed cost of a
      call no longer most of it).
    {"shape", "bytes", "numel"} of that row, or None when the largest size is not so (or nothing was timed)."""
    timed = sorted((r for r in rows if not r.get("error") and r.get("e2e_us")), key=lambda r: r["bytes"])
    if not timed:
        return None
    floor = min(r["e2e_us"] for r in timed)

    def holds(r: dict) -> bool:
        if on_gpu:
            return r.get("device_us") is not None and r["e2e_us"] <= GPU_BOUND_FACTOR * r["device_us"]
        return r["e2e_us"] >= GROWTH_FACTOR * floor

    first = None
    for r in reversed(timed):
        if not holds(r):
            break
        first = r
    return None if first is None else {"shape": first["shape"], "bytes": first["bytes"], "numel": first.get("numel")}
