"""bench --compare's core (bench.compare.compare_to_baseline): this run's cases against a baseline's, matched by
every field of the case (op, impl, dtype, shape, options, pass, layout), never by position; now / baseline medians,
regressions past the threshold, noisy timings and another machine said."""

from __future__ import annotations

import pytest

from fuselab.bench.compare import compare_to_baseline
from fuselab.bench.record import Case, Row, Status


def row(impl: str, shape: tuple[int, ...], ms: float, dtype: str = "float32", form: str = "tanh", **fields) -> Row:
    case = Case.of("gelu", impl, dtype, shape, {"approximate": form}, pass_=fields.pop("pass_", "forward"))
    return Row(case, median_ms=ms, iqr_ms=ms / 100, device="cpu", **fields)


FACTORS = (1, 1.2, 1, 0.5, 1, 1.04)  # now / baseline of the first six cases


def test_cases_are_matched_by_their_fields_never_by_position() -> None:
    baseline = [
        row("torch", (4096,), 1.0),
        row("torch", (4096,), 2.0, form="none"),  # differs only by an option
        row("torch", (4096,), 3.0, dtype="bfloat16"),  # only by the dtype
        row("naive", (4096,), 4.0),  # only by the impl
        row("torch", (8192,), 5.0),  # only by the shape
        row("torch", (4096,), 6.0, pass_="forward+backward"),  # only by the pass
        row("torch", (7,), 1.0),  # not run now
    ]
    now = [r.updated(median_ms=r.median_ms * factor) for r, factor in zip(baseline[:6], FACTORS, strict=True)]
    now.reverse()
    now.append(row("compile", (4096,), 9.0))  # new
    now.append(Row(Case.of("gelu", "triton", "float32", (4096,), {"approximate": "tanh"}), Status.SKIPPED, "interp"))
    got = compare_to_baseline(now, baseline, threshold=0.05)
    ratios = {(c.case.impl, c.case.dtype, c.case.shape, c.case.option_values["approximate"], c.case.pass_): c.ratio
              for c in got.changes}  # fmt: skip
    assert ratios == pytest.approx(
        {
            ("torch", "float32", (4096,), "tanh", "forward"): 1.0,
            ("torch", "float32", (4096,), "none", "forward"): 1.2,
            ("torch", "bfloat16", (4096,), "tanh", "forward"): 1.0,
            ("naive", "float32", (4096,), "tanh", "forward"): 0.5,
            ("torch", "float32", (8192,), "tanh", "forward"): 1.0,
            ("torch", "float32", (4096,), "tanh", "forward+backward"): 1.04,
        }
    )
    assert [c.case.option_values["approximate"] for c in got.regressions] == ["none"]  # 4% is within 5%
    assert got.changes[0].regressed and got.changes[0].ratio == pytest.approx(1.2)  # slowest change first
    assert (got.only_now, got.only_baseline) == (1, 1)  # a skipped row is no case measured


def test_a_noisy_timing_on_either_side_is_said_and_another_device_is_named() -> None:
    quiet = row("torch", (4096,), 1.0)
    busy = row("torch", (4096,), 2.0, cpu_busy=0.9)
    (change,) = compare_to_baseline([busy], [quiet]).changes
    assert change.regressed and change.noisy
    (change,) = compare_to_baseline([quiet], [quiet]).changes
    assert not change.noisy
    assert compare_to_baseline([quiet], [quiet]).elsewhere is None
    on_gpu = quiet.updated(device="cuda", gpu="NVIDIA H200")
    assert compare_to_baseline([quiet], [on_gpu]).elsewhere == "the baseline ran on NVIDIA H200, this run on cpu"


def test_the_threshold_is_a_fraction_at_least_zero() -> None:
    with pytest.raises(ValueError, match="threshold"):
        compare_to_baseline([], [], threshold=-0.1)
