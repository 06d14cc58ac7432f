"""What the tools choose for what a user left out of a bench run: shapes sized for the CPU, capped random draws,
the plot's x axis. Generic over ops (it reads `op.defaults` and the cost model); the CLI prints the notes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from fuselab.bench.dtypes import short_name
from fuselab.bench.record import Row
from fuselab.bench.shapes import format_shape, scale_shape
from fuselab.evaluate.draws import draw_op_shapes
from fuselab.ops.registry import Op, Shape

CPU_DEFAULT_NUMEL = 2**20  # on the CPU, a memory-bound op's (GPU-sized) bench shapes: at most this many elements
CPU_DEFAULT_FLOPS = 2e8  # and a compute-bound op's: at most this many FLOPs a call (tens of ms at CPU rates)
CPU_RANDOM_CAP = {"max_bytes": 4 * 2**20, "max_flops": 1e8}  # random draws on the CPU: per call, by the cost model


@dataclass(frozen=True)
class BenchCases:
    """The shapes and impls a bench run times (None: the op's, all of them), whether the shapes were drawn, and one
    line for each choice made for the user."""

    shapes: list[Shape] | None
    impls: list[str] | None
    drawn: bool = False
    notes: list[str] = field(default_factory=list)


def bench_cases(
    op: Op, device: str, shapes: list[Shape] | None, impls: list[str] | None, draw: int | None = None, seed: int = 0
) -> BenchCases:
    """What to time: `shapes` as given; `draw` shapes from the op's random_shape (capped on the CPU, where compiled
    impls, one torch.compile per shape, are left out unless named); or the op's bench shapes, on the CPU scaled down
    to CPU_DEFAULT_NUMEL elements (`cap_numel`)."""
    cpu = device == "cpu"
    if draw is not None:
        drawn = draw_op_shapes(op, draw, seed, **(CPU_RANDOM_CAP if cpu else {}))
        if not cpu:
            return BenchCases(drawn, impls, drawn=True)
        note = (
            f"on the CPU, each drawn shape is capped at {CPU_RANDOM_CAP['max_bytes'] // 2**20} MiB moved and "
            f"{CPU_RANDOM_CAP['max_flops']:.0e} FLOPs a call (its first dimension cut)"
        )
        compiled = [name for name, impl in op.impls.items() if impl.compiled]
        if impls is None and compiled:
            impls = [name for name in op.impls if name not in compiled]
            note += f"; {', '.join(compiled)} (one torch.compile per shape) left out: name it with --impl to time it"
        return BenchCases(drawn, impls, drawn=True, notes=[note])
    if shapes is None and cpu:
        if op.bound == "compute":  # by FLOPs: halving the largest leading dimension keeps (a sequence N) well above 1
            options = op.default_options()
            flops = lambda shape: float(op.flops(shape, **options))  # noqa: E731
            shapes = list(dict.fromkeys(scale_shape(s, CPU_DEFAULT_FLOPS, flops) for s in op.defaults.bench_shapes))
            limit = f"{CPU_DEFAULT_FLOPS:.0e} FLOPs a call"
        else:
            shapes = cap_numel(list(op.defaults.bench_shapes), CPU_DEFAULT_NUMEL)
            limit = f"{CPU_DEFAULT_NUMEL} elements"
        note = (
            f"on the CPU, the op's default shapes (sized for a GPU) are scaled down to at most {limit}: "
            f"{', '.join(format_shape(s) for s in shapes)}; choose others with --shape"
        )
        return BenchCases(shapes, impls, notes=[note])
    return BenchCases(shapes, impls)


def cap_numel(shapes: list[Shape], max_numel: int) -> list[Shape]:
    """The shapes with at most `max_numel` elements each: the last dimension is kept (a softmax row stays a row) and
    the leading ones shrink; a 1-D shape shrinks to max_numel. Duplicates are dropped, the order kept."""
    out: list[Shape] = []
    for shape in shapes:
        shape = tuple(shape)
        if math.prod(shape) > max_numel:
            if len(shape) == 1:
                shape = (max_numel,)
            else:
                rows = max(1, max_numel // shape[-1])
                shape = (rows, shape[-1]) if len(shape) == 2 else (rows, *(1,) * (len(shape) - 2), shape[-1])
        if shape not in out:
            out.append(shape)
    return out


def speed_axis(rows: list[Row], op: Op) -> tuple[list[dict], str, str]:
    """(points, x field, x label) for the speed plot: the op's own axis (attention: N), else the element count where
    it varies across the rows, else the last dimension (softmax sweeps the row width at a fixed element count). Each
    point is a row's JSON form with `x` and `panel` (dtype, option values, pass, and the op's panel of its shape: one
    plot per panel)."""

    def panel(r: Row) -> str:
        parts = [short_name(r.case.dtype), *(f"{k}={r.field(k)}" for k in op.options), r.case.pass_ or ""]
        if op.defaults.panel is not None:
            parts.append(op.defaults.panel(r.case.shape))
        return " ".join(p for p in parts if p and p != "forward")

    if op.defaults.axis is not None:
        label, value = op.defaults.axis
        xs = [value(r.case.shape) for r in rows]
    elif len({r.numel for r in rows if r.measured}) > 1:
        label, xs = "elements", [r.numel for r in rows]
    else:
        label, xs = "last dimension", [(r.case.shape or (1,))[-1] for r in rows]
    return [{**r.to_json(), "x": x, "panel": panel(r)} for r, x in zip(rows, xs, strict=True)], "x", label
