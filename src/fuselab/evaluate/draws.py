"""Every shape: shapes drawn from an op's `random_shape` (capped by its cost model), each impl's time over the
fastest of the op's peers on the same shape, and over its own contiguous time on non-contiguous layouts."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import torch

from fuselab.bench.record import CONTIGUOUS, Row
from fuselab.bench.shapes import add_ratios, draw_shapes, summarize
from fuselab.ops.registry import Op, Shape


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


def rival_ratios(op: Op, rows: Sequence[Row], by: Sequence[str] = ()) -> list[dict]:
    """Per impl (the rivals' own left out), dtype and the fields `by`: its time over the fastest of the op's rivals
    (`Defaults.rivals`) on the same case, summarized as `shape_ratios` does; empty without rivals or their rows."""
    if not op.defaults.rivals:
        return []
    ours = [r for r in add_ratios(rows, op.defaults.rivals) if r.case.impl not in op.defaults.rivals]
    return summarize(ours, ("impl", "dtype", *by))


def layout_ratios(op: Op, rows: Sequence[Row], by: Sequence[str] = ()) -> list[dict]:
    """Per impl, dtype, layout other than contiguous and the fields `by`: its time on the layout over its contiguous
    time plus the copy PyTorch makes, on the same case, summarized as `shape_ratios` does. The copy is what the layout
    adds to the op's baseline impl (the PyTorch built-in: its time on the layout less its contiguous time; none where
    it adds nothing), so 1.10 means 10% slower than a user's `.contiguous()` then the contiguous call would be, had
    that copy cost what PyTorch's does. Empty without contiguous rows or the baseline's."""
    timed = {r.case.key: r.median_ms for r in rows if r.measured and r.median_ms}
    baseline = op.defaults.baseline
    rated = []
    for r in rows:
        if r.case.layout == CONTIGUOUS or r.case.key not in timed:
            continue
        flat = dataclasses.replace(r.case, layout=CONTIGUOUS)
        keys = (flat.key, r.case.with_impl(baseline).key, flat.with_impl(baseline).key)
        own, base_here, base_flat = (timed.get(key) for key in keys)
        if own is None or base_here is None or base_flat is None:
            continue
        rated.append(r.updated(ratio=timed[r.case.key] / (own + max(0.0, base_here - base_flat))))
    return summarize(rated, ("impl", "dtype", "layout", *by))
