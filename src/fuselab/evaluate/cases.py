"""What a case needs before it runs: whether an impl can run here, whether the case fits in memory, its float64
reference (whole or in pieces), the option grid, the callable to run, a fresh seed and its estimated cost."""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from fuselab.bench import distributed
from fuselab.bench.accuracy import error_from_sums, error_sums, relative_error
from fuselab.bench.compiled import WatchedCompile
from fuselab.bench.memory import format_bytes, free_bytes
from fuselab.bench.record import Case
from fuselab.bench.shapes import format_shape
from fuselab.bench.sweep import TooBig, Unavailable
from fuselab.bench.timer import Timing
from fuselab.ops.backends import triton_unavailable
from fuselab.ops.registry import Impl, Op, Shape, all_ops

REFERENCE_TOO_BIG = "the float64 reference did not fit in memory: not checked at this size"


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


PIECES_IN_FLIGHT = 16  # what the pieces hold at once, in REFERENCE_PIECE_BYTES: input, reference, temporaries, error


def in_pieces(op: Op, shape: Shape) -> bool:
    """Whether the op's reference of a case of `shape` may be made a slice of rows at a time (`Defaults.rows_from`)."""
    least = op.defaults.rows_from
    return least is not None and len(shape) >= max(least, 1) and shape[0] > 0


REFERENCE_PIECE_BYTES = 2**23  # a reference computed in pieces: about this many float64 input bytes at a time


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

    @property
    def shape(self) -> tuple[int, ...]:
        """The reference's shape (an output's): the input's where it is made in pieces and not kept."""
        return tuple((self.kept if self.kept is not None else self.inputs[0]).shape)

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
            sums.append(error_sums(out[i : i + rows], piece))
            del piece
        return error_from_sums(sums)


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
