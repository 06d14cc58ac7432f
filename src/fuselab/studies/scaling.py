"""How time scales: a matmul against its size, and an MLP's forward + backward against layers, steps, batch, dim.

Matmul: small sizes are bound by launch overhead and an under-used GPU, so their time is nearly flat in n; large
sizes are bound by compute, so their time grows as n³ (linear in FLOPs). `regimes` finds the two. MLP: time is
linear in layers and steps (each adds the same kernels); `linear_fit` gives the fitted line and its R², and
`power_fit` the exponent, which says what "linear" hides for batch and dim.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import torch
from torch import nn

from fuselab.bench.dtypes import DTYPES
from fuselab.bench.record import Status
from fuselab.bench.sweep import run_sweep
from fuselab.bench.timer import Measurement, Timing, benchmark

# ------------------------------------------------------------------------------------------------ fits


@dataclass(frozen=True)
class Fit:
    """The least-squares line y = intercept + slope * x; r2 = 1 - SS_res / SS_tot (1.0 for a perfect fit)."""

    slope: float
    intercept: float
    r2: float


@dataclass(frozen=True)
class PowerFit:
    """y ≈ coefficient * x^exponent, fitted as a line in log-log; r2: that line's R²."""

    exponent: float
    coefficient: float
    r2: float


@dataclass(frozen=True)
class Regimes:
    """Where time is flat in n and from where it grows as n³ (see `regimes`).

    flat_until: the largest n within a factor of the smallest size's time; cubic_from: the smallest n from which
    every step is cubic (None: the largest step is not); local_exponents: the log-log slope of each step (len(n) -
    1); small/large_exponent: the log-log slope over the three smallest and the three largest sizes.
    """

    flat_until: int
    cubic_from: int | None
    local_exponents: tuple[float, ...]
    small_exponent: float
    large_exponent: float


@dataclass(frozen=True)
class AxisFit:
    """Time (ms) against one swept MLP axis: the least-squares line (slope in ms per unit, intercept in ms), its R²,
    the log-log exponent, and how many points were fitted."""

    slope: float
    intercept: float
    r2: float
    exponent: float
    points: int


def linear_fit(xs: Sequence[float], ys: Sequence[float]) -> Fit:
    """Least-squares line y = intercept + slope * x, and R² = 1 - SS_res / SS_tot (1.0 for a perfect fit)."""
    if len(xs) != len(ys) or len(xs) < 2:
        raise ValueError(f"linear_fit needs two or more (x, y) pairs of equal length, got {len(xs)} and {len(ys)}")
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        raise ValueError("linear_fit needs at least two distinct x values")
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    intercept = my - slope * mx
    ss_res = sum((y - intercept - slope * x) ** 2 for x, y in zip(xs, ys, strict=True))
    ss_tot = sum((y - my) ** 2 for y in ys)
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else (1.0 if ss_res == 0 else 0.0)
    return Fit(slope=slope, intercept=intercept, r2=r2)


def power_fit(xs: Sequence[float], ys: Sequence[float]) -> PowerFit:
    """y ≈ c * x^exponent, fitted as a line in log-log: exponent, c and the R² of the log-log line."""
    if any(v <= 0 for v in [*xs, *ys]):
        raise ValueError("power_fit needs positive x and y")
    fit = linear_fit([math.log(x) for x in xs], [math.log(y) for y in ys])
    return PowerFit(exponent=fit.slope, coefficient=math.exp(fit.intercept), r2=fit.r2)


def local_exponents(xs: Sequence[float], ys: Sequence[float]) -> list[float]:
    """d log y / d log x between consecutive points (len(xs) - 1 values): 0 = flat, 3 = cubic."""
    return [math.log(y1 / y0) / math.log(x1 / x0) for x0, x1, y0, y1 in zip(xs, xs[1:], ys, ys[1:], strict=False)]


def regimes(sizes: Sequence[int], times: Sequence[float], *, flat_factor: float = 2.0, cubic: float = 2.5) -> Regimes:
    """Where time (any unit) is flat in n and from where it grows as n³.

    flat_until: the largest n whose time is within `flat_factor` of the smallest size's time.
    cubic_from: the smallest n from which every step to the next size has a local exponent >= `cubic`
    (None when the largest step is not cubic). small/large_exponent: the log-log slope over the first and the
    last three sizes.
    """
    if len(sizes) < 3:
        raise ValueError("regimes needs at least three sizes")
    pairs = sorted(zip(sizes, times, strict=True))
    ns, ts = [p[0] for p in pairs], [p[1] for p in pairs]
    flat_until = max(n for n, t in zip(ns, ts, strict=True) if t <= flat_factor * ts[0])
    slopes = local_exponents(ns, ts)
    cubic_from = None
    for i in range(len(slopes) - 1, -1, -1):
        if slopes[i] < cubic:
            break
        cubic_from = ns[i]
    return Regimes(
        flat_until=flat_until,
        cubic_from=cubic_from,
        local_exponents=tuple(slopes),
        small_exponent=power_fit(ns[:3], ts[:3]).exponent,
        large_exponent=power_fit(ns[-3:], ts[-3:]).exponent,
    )


# ------------------------------------------------------------------------------------------------ points


@dataclass(frozen=True, kw_only=True)
class Timed:
    """What a study measured at one point: status / error (OK with error None, else why not, and the figures None),
    the median and IQR in ms, reps (the samples timed), the timer's warnings, FLOPs and TFLOP/s."""

    status: Status = Status.OK
    error: str | None = None
    median_ms: float | None = None
    iqr_ms: float | None = None
    reps: int | None = None
    warnings: tuple[str, ...] = ()
    flops: int | None = None
    tflops: float | None = None


@dataclass(frozen=True)
class MatmulPoint(Timed):
    """One size of the matmul study: C = A @ B for n x n matrices of `dtype`; flops and bytes (the fewest moved) of
    one matmul, ai: FLOPs per byte, gbps: GB/s."""

    n: int
    dtype: str
    bytes: int | None = None
    ai: float | None = None
    gbps: float | None = None


@dataclass(frozen=True)
class MlpPoint(Timed):
    """One point of the MLP study: `axis` set to `value`, the others at the base (layers, steps, batch, dim); times
    are of all `steps` passes, flops the matmul FLOPs of the steps."""

    axis: str
    value: int
    layers: int
    steps: int
    batch: int
    dim: int


Point = TypeVar("Point", MatmulPoint, MlpPoint)


def from_row(cls: type[Point], row: Mapping[str, object]) -> Point:
    """A point from a sweep row or its JSON form (a log line, a results file's record; old files too): the fields
    the point has, the row's others left out."""
    names = {f.name for f in dataclasses.fields(cls)}
    values = {k: v for k, v in row.items() if k in names}
    values["status"] = Status(values.get("status") or (Status.ERROR if values.get("error") else Status.OK))
    values["warnings"] = tuple(values.get("warnings") or ())
    return cls(**values)


# ------------------------------------------------------------------------------------------------ matmul


def _stats(m: Measurement) -> dict:
    """The measurement's statistics, its sample count as `reps` (a case's `n` is a matrix size)."""
    stats = m.summary()
    stats["reps"] = stats.pop("n")
    return stats


def matmul_flops(n: int) -> int:
    """An n x n by n x n matmul: n² dot products of length n, a multiply and an add each."""
    return 2 * n**3


def matmul_bytes(n: int, dtype: torch.dtype) -> int:
    """The fewest bytes: read A and B, write C."""
    return 3 * n * n * dtype.itemsize


def matmul_scaling(
    sizes: Sequence[int],
    *,
    dtypes: Sequence[str] = ("float32",),
    device: str = "cpu",
    timing: Timing | None = None,
    out: str | Path | None = None,
    show_progress: bool = True,
) -> list[MatmulPoint]:
    """Time C = A @ B for square n x n matrices, n in `sizes`, in each of `dtypes`: one point each, in that order.

    Every row (all the timing's statistics) goes to `out` (JSON lines, resumable).
    timing: how each size is timed, without an L2 flush (flush_l2 is set False: the study is about compute).
    """
    timing = Timing.of(timing, flush_l2=False)

    def run(case: dict) -> dict:
        n, dtype = case["n"], DTYPES[case["dtype"]]
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        m = benchmark(lambda: a @ b, label=f"matmul {n}", device=device, timing=timing)
        seconds = m.median_ms * 1e-3
        return {
            **_stats(m),
            "flops": matmul_flops(n),
            "bytes": matmul_bytes(n, dtype),
            "ai": matmul_flops(n) / matmul_bytes(n, dtype),
            "tflops": matmul_flops(n) / seconds / 1e12,
            "gbps": matmul_bytes(n, dtype) / seconds / 1e9,
        }

    cases = [{"study": "matmul", "dtype": d, "n": n} for d in dtypes for n in sizes]
    rows = run_sweep(cases, run, out, description="matmul", show_progress=show_progress)
    return [from_row(MatmulPoint, r) for r in rows]


# ------------------------------------------------------------------------------------------------ MLP

MLP_AXES = ("layers", "steps", "batch", "dim")


def make_mlp(dim: int, layers: int, *, device: str = "cpu", dtype: torch.dtype = torch.float32) -> nn.Sequential:
    """`layers` blocks of Linear(dim, dim) + GELU, as in the lecture."""
    if dim < 1 or layers < 1:
        raise ValueError(f"an MLP needs dim >= 1 and layers >= 1, got dim={dim}, layers={layers}")
    blocks: list[nn.Module] = []
    for _ in range(layers):
        blocks += [nn.Linear(dim, dim), nn.GELU()]
    return nn.Sequential(*blocks).to(device=device, dtype=dtype)


def mlp_flops(dim: int, layers: int, batch: int, steps: int) -> int:
    """Matmul FLOPs of `steps` forward + backward passes: 2·batch·dim² per layer forward, twice that backward."""
    return 3 * 2 * batch * dim * dim * layers * steps


def mlp_scaling(
    base: dict[str, int],
    sweeps: dict[str, Sequence[int]],
    *,
    device: str = "cpu",
    timing: Timing | None = None,
    out: str | Path | None = None,
    show_progress: bool = True,
) -> list[MlpPoint]:
    """Time `steps` forward + backward passes of the MLP, varying one axis at a time around `base`.

    base: {"layers", "steps", "batch", "dim"}; sweeps: axis -> values. One point per value, in sweep order; every
    row (all the timing's statistics) goes to `out` (JSON lines, resumable).
    """
    missing = [a for a in MLP_AXES if a not in base]
    unknown = [a for a in sweeps if a not in MLP_AXES]
    if missing or unknown:
        raise ValueError(f"mlp_scaling: base needs {MLP_AXES}; sweeps take only those axes (got {missing or unknown})")
    timing = Timing.of(timing, flush_l2=False)

    def run(case: dict) -> dict:
        cfg = {a: case[a] for a in MLP_AXES}
        model = make_mlp(cfg["dim"], cfg["layers"], device=device)
        x = torch.randn(cfg["batch"], cfg["dim"], device=device)

        def steps() -> None:
            for _ in range(cfg["steps"]):
                model(x).mean().backward()

        m = benchmark(steps, label="mlp", device=device, timing=timing)
        flops = mlp_flops(**cfg)
        return {**_stats(m), "flops": flops, "tflops": flops / (m.median_ms * 1e-3) / 1e12}

    cases = [
        {"study": "mlp", "axis": axis, "value": v, **{**base, axis: v}}
        for axis, values in sweeps.items()
        for v in values
    ]
    rows = run_sweep(cases, run, out, description="mlp", show_progress=show_progress)
    return [from_row(MlpPoint, r) for r in rows]


def measured(points: Sequence[MlpPoint], axis: str) -> list[tuple[int, float]]:
    """(value, median_ms) of the points of `axis` that were measured, by value."""
    return sorted(
        (p.value, p.median_ms) for p in points if p.axis == axis and p.error is None and p.median_ms is not None
    )


def mlp_fits(points: Sequence[MlpPoint]) -> dict[str, AxisFit]:
    """Per swept axis with two or more distinct measured values: the fit of median_ms against the value."""
    fits = {}
    for axis in MLP_AXES:
        pts = measured(points, axis)
        if len({v for v, _ in pts}) < 2:
            continue
        xs, ys = [v for v, _ in pts], [t for _, t in pts]
        line = linear_fit(xs, ys)
        fits[axis] = AxisFit(line.slope, line.intercept, line.r2, power_fit(xs, ys).exponent, len(pts))
    return fits
