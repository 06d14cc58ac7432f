import dataclasses
import json
import math
import random

import numpy as np
import pytest
import torch

from fuselab.studies.scaling import (
    MatmulPoint,
    MlpPoint,
    from_row,
    linear_fit,
    local_exponents,
    make_mlp,
    matmul_scaling,
    mlp_fits,
    mlp_flops,
    mlp_scaling,
    power_fit,
    regimes,
)

TINY = {"warmup_ms": 1.0, "min_warmup": 1, "rep_ms": 2.0, "min_reps": 3, "max_reps": 5}


def test_linear_fit_recovers_an_exact_line():
    xs = [1, 2, 4, 8, 16]
    fit = linear_fit(xs, [3.0 + 0.5 * x for x in xs])
    assert fit.slope == pytest.approx(0.5)
    assert fit.intercept == pytest.approx(3.0)
    assert fit.r2 == pytest.approx(1.0)


def test_linear_fit_r2_matches_numpy_on_noisy_data():
    rng = random.Random(7)
    xs = [float(x) for x in range(1, 23)]
    ys = [2.0 * x + 1.0 + rng.gauss(0, 3.0) for x in xs]
    fit = linear_fit(xs, ys)
    slope, intercept = np.polyfit(xs, ys, 1)
    predicted = np.polyval([slope, intercept], xs)
    r2 = 1 - np.sum((np.array(ys) - predicted) ** 2) / np.sum((np.array(ys) - np.mean(ys)) ** 2)
    assert fit.slope == pytest.approx(slope)
    assert fit.intercept == pytest.approx(intercept)
    assert fit.r2 == pytest.approx(r2)
    assert 0.5 < fit.r2 < 1.0


def test_a_curve_fits_a_line_worse_than_a_line_does():
    xs = [1, 2, 4, 8, 16, 32]
    assert linear_fit(xs, [x**2 for x in xs]).r2 < linear_fit(xs, [5 * x for x in xs]).r2


def test_linear_fit_rejects_too_few_or_equal_points():
    with pytest.raises(ValueError, match="two or more"):
        linear_fit([1.0], [2.0])
    with pytest.raises(ValueError, match="equal length"):
        linear_fit([1.0, 2.0], [2.0])
    with pytest.raises(ValueError, match="distinct"):
        linear_fit([3.0, 3.0], [1.0, 2.0])


def test_power_fit_and_local_exponents_find_the_power():
    xs = [2, 4, 8, 16, 32]
    fit = power_fit(xs, [3 * x**2.5 for x in xs])
    assert fit.exponent == pytest.approx(2.5)
    assert fit.coefficient == pytest.approx(3.0)
    assert local_exponents(xs, [x**3 for x in xs]) == pytest.approx([3.0] * 4)
    with pytest.raises(ValueError, match="positive"):
        power_fit([0, 1], [1, 2])


def test_regimes_find_the_flat_part_and_the_cubic_part():
    sizes = [2**k for k in range(4, 14)]
    # launch bound at 10 µs until the n³ work (1 ms at n = 1024) passes it
    times = [max(0.01, (n / 1024) ** 3) for n in sizes]
    reg = regimes(sizes, times)
    assert reg.flat_until == 256  # 0.0156 ms is within 2x of 0.01 ms; 512 (0.125 ms) is not
    assert reg.cubic_from == 256  # the step 256 -> 512 is already cubic
    assert reg.small_exponent == pytest.approx(0.0)
    assert reg.large_exponent == pytest.approx(3.0)
    assert len(reg.local_exponents) == len(sizes) - 1


def test_regimes_without_a_cubic_tail():
    reg = regimes([16, 32, 64, 128], [1.0, 1.0, 1.1, 1.2])
    assert reg.cubic_from is None
    assert reg.flat_until == 128
    with pytest.raises(ValueError, match="three"):
        regimes([1, 2], [1.0, 2.0])


def point(axis: str, value: int, **figures: object) -> MlpPoint:
    return MlpPoint(axis=axis, value=value, **{"layers": 2, "steps": 1, "batch": 4, "dim": 8, axis: value}, **figures)


def test_mlp_fits_per_axis_from_points():
    points = [point("layers", v, median_ms=0.2 + 0.5 * v) for v in (1, 2, 4, 8)]
    points += [point("dim", v, median_ms=1e-4 * v * v) for v in (64, 128, 256, 512)]
    points += [point("steps", 1, median_ms=1.0), point("batch", 8, status="error", error="oom")]
    fits = mlp_fits(points)
    assert set(fits) == {"layers", "dim"}  # steps has one point, batch none that finished
    assert fits["layers"].slope == pytest.approx(0.5)
    assert fits["layers"].r2 == pytest.approx(1.0)
    assert fits["layers"].points == 4
    assert fits["dim"].exponent == pytest.approx(2.0)
    assert fits["dim"].r2 < 0.99


def test_points_load_from_sweep_rows_old_and_new():
    """A point from a row of the sweep's log (more fields than a point has), an old row without status or
    warnings, and a failed one; dataclasses.asdict gives a JSON record that loads back the same."""
    new = {"study": "matmul", "dtype": "float32", "n": 64, "status": "ok", "median_ms": 0.01, "mean_ms": 0.02,
           "reps": 9, "warnings": ["noisy"], "flops": 2 * 64**3, "error": None, "key": "{}"}  # fmt: skip
    p = from_row(MatmulPoint, new)
    assert (p.n, p.median_ms, p.reps, p.warnings, p.status) == (64, 0.01, 9, ("noisy",), "ok")
    assert from_row(MatmulPoint, json.loads(json.dumps(dataclasses.asdict(p)))) == p
    old = from_row(MatmulPoint, {"n": 8, "dtype": "float32", "median_ms": 0.5, "error": None})
    assert old.status == "ok" and old.warnings == ()
    failed = from_row(MlpPoint, {"axis": "dim", "value": 4, "layers": 1, "steps": 1, "batch": 1, "dim": 4,
                                 "error": "out of memory"})  # fmt: skip
    assert failed.status == "error" and failed.median_ms is None


def test_matmul_scaling_points_on_the_cpu(tmp_path):
    out = tmp_path / "mm.jsonl"
    points = matmul_scaling([8, 16, 32], device="cpu", timing=TINY, out=out, show_progress=False)
    assert [p.n for p in points] == [8, 16, 32]  # the matrix size, not the repetition count
    for p in points:
        assert p.error is None and p.status == "ok"
        assert p.reps >= 3
        assert p.flops == 2 * p.n**3
        assert p.bytes == 3 * p.n**2 * 4
        assert p.tflops == pytest.approx(p.flops / (p.median_ms * 1e-3) / 1e12)
        assert p.ai == pytest.approx(p.flops / p.bytes)
    assert len(out.read_text().splitlines()) == 3
    assert matmul_scaling([8, 16, 32], device="cpu", timing=TINY, out=out, show_progress=False) == points  # resumed


def test_mlp_scaling_varies_one_axis_at_a_time():
    base = {"layers": 2, "steps": 1, "batch": 4, "dim": 8}
    points = mlp_scaling(base, {"layers": [1, 3], "dim": [4, 16]}, device="cpu", timing=TINY, show_progress=False)
    assert [(p.axis, p.value) for p in points] == [("layers", 1), ("layers", 3), ("dim", 4), ("dim", 16)]
    assert points[1].layers == 3 and points[1].dim == 8
    assert points[3].dim == 16 and points[3].layers == 2
    assert all(p.error is None and p.median_ms > 0 for p in points)
    assert points[3].flops == mlp_flops(16, 2, 4, 1)
    with pytest.raises(ValueError, match="axes"):
        mlp_scaling(base, {"width": [1]}, show_progress=False)


def test_make_mlp_shape_and_errors():
    model = make_mlp(8, 3)
    assert sum(isinstance(m, torch.nn.Linear) for m in model) == 3
    assert model(torch.randn(5, 8)).shape == (5, 8)
    assert mlp_flops(8, 3, 5, 2) == 6 * 5 * 64 * 3 * 2
    with pytest.raises(ValueError, match="layers"):
        make_mlp(8, 0)
    assert math.isclose(mlp_flops(1, 1, 1, 1), 6)
