import math
import random

import numpy as np
import pytest
import torch

from fuselab.studies.scaling import (
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
    assert fit["slope"] == pytest.approx(0.5)
    assert fit["intercept"] == pytest.approx(3.0)
    assert fit["r2"] == pytest.approx(1.0)


def test_linear_fit_r2_matches_numpy_on_noisy_data():
    rng = random.Random(7)
    xs = [float(x) for x in range(1, 23)]
    ys = [2.0 * x + 1.0 + rng.gauss(0, 3.0) for x in xs]
    fit = linear_fit(xs, ys)
    slope, intercept = np.polyfit(xs, ys, 1)
    predicted = np.polyval([slope, intercept], xs)
    r2 = 1 - np.sum((np.array(ys) - predicted) ** 2) / np.sum((np.array(ys) - np.mean(ys)) ** 2)
    assert fit["slope"] == pytest.approx(slope)
    assert fit["intercept"] == pytest.approx(intercept)
    assert fit["r2"] == pytest.approx(r2)
    assert 0.5 < fit["r2"] < 1.0


def test_a_curve_fits_a_line_worse_than_a_line_does():
    xs = [1, 2, 4, 8, 16, 32]
    assert linear_fit(xs, [x**2 for x in xs])["r2"] < linear_fit(xs, [5 * x for x in xs])["r2"]


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
    assert fit["exponent"] == pytest.approx(2.5)
    assert fit["coefficient"] == pytest.approx(3.0)
    assert local_exponents(xs, [x**3 for x in xs]) == pytest.approx([3.0] * 4)
    with pytest.raises(ValueError, match="positive"):
        power_fit([0, 1], [1, 2])


def test_regimes_find_the_flat_part_and_the_cubic_part():
    sizes = [2**k for k in range(4, 14)]
    # launch bound at 10 µs until the n³ work (1 ms at n = 1024) passes it
    times = [max(0.01, (n / 1024) ** 3) for n in sizes]
    reg = regimes(sizes, times)
    assert reg["flat_until"] == 256  # 0.0156 ms is within 2x of 0.01 ms; 512 (0.125 ms) is not
    assert reg["cubic_from"] == 256  # the step 256 -> 512 is already cubic
    assert reg["small_exponent"] == pytest.approx(0.0)
    assert reg["large_exponent"] == pytest.approx(3.0)
    assert len(reg["local_exponents"]) == len(sizes) - 1


def test_regimes_without_a_cubic_tail():
    reg = regimes([16, 32, 64, 128], [1.0, 1.0, 1.1, 1.2])
    assert reg["cubic_from"] is None
    assert reg["flat_until"] == 128
    with pytest.raises(ValueError, match="three"):
        regimes([1, 2], [1.0, 2.0])


def test_mlp_fits_per_axis_from_rows():
    rows = [{"axis": "layers", "value": v, "median_ms": 0.2 + 0.5 * v} for v in (1, 2, 4, 8)]
    rows += [{"axis": "dim", "value": v, "median_ms": 1e-4 * v * v} for v in (64, 128, 256, 512)]
    rows += [{"axis": "steps", "value": 1, "median_ms": 1.0}, {"axis": "batch", "value": 8, "error": "oom"}]
    fits = mlp_fits(rows)
    assert set(fits) == {"layers", "dim"}  # steps has one point, batch none that finished
    assert fits["layers"]["slope"] == pytest.approx(0.5)
    assert fits["layers"]["r2"] == pytest.approx(1.0)
    assert fits["dim"]["exponent"] == pytest.approx(2.0)
    assert fits["dim"]["r2"] < 0.99


def test_matmul_scaling_rows_on_the_cpu(tmp_path):
    out = tmp_path / "mm.jsonl"
    rows = matmul_scaling([8, 16, 32], device="cpu", timing=TINY, out=out, show_progress=False)
    assert [r["n"] for r in rows] == [8, 16, 32]  # the matrix size, not the repetition count
    for r in rows:
        assert r["error"] is None
        assert r["reps"] >= 3
        assert r["flops"] == 2 * r["n"] ** 3
        assert r["bytes"] == 3 * r["n"] ** 2 * 4
        assert r["tflops"] == pytest.approx(r["flops"] / (r["median_ms"] * 1e-3) / 1e12)
        assert r["ai"] == pytest.approx(r["flops"] / r["bytes"])
    assert len(out.read_text().splitlines()) == 3


def test_mlp_scaling_varies_one_axis_at_a_time():
    base = {"layers": 2, "steps": 1, "batch": 4, "dim": 8}
    rows = mlp_scaling(base, {"layers": [1, 3], "dim": [4, 16]}, device="cpu", timing=TINY, show_progress=False)
    assert [(r["axis"], r["value"]) for r in rows] == [("layers", 1), ("layers", 3), ("dim", 4), ("dim", 16)]
    assert rows[1]["layers"] == 3 and rows[1]["dim"] == 8
    assert rows[3]["dim"] == 16 and rows[3]["layers"] == 2
    assert all(r["error"] is None and r["median_ms"] > 0 for r in rows)
    assert rows[3]["flops"] == mlp_flops(16, 2, 4, 1)
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
