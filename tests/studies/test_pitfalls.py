import time

import pytest
import torch

from fuselab.studies.pitfalls import matmul_maker, op_maker, time_three_ways

TIMING = {"warmup_ms": 5.0, "rep_ms": 20.0, "min_reps": 5}


def slow_first_call(first_s: float, then_s: float):
    """A maker whose callable sleeps `first_s` on its first call (a compile, say) and `then_s` after."""

    def make():
        calls = []

        def fn():
            time.sleep(first_s if not calls else then_s)
            calls.append(1)

        return fn

    return make


def test_the_first_call_and_a_loop_without_warmup_over_report():
    row = time_three_ways(slow_first_call(0.06, 0.001), label="sleepy", device="cpu", timing=TIMING, reps=10)
    assert row["first_call_ms"] >= 60
    assert 0.9 <= row["correct_ms"] <= 5
    assert row["first_call_ratio"] == pytest.approx(row["first_call_ms"] / row["correct_ms"])
    assert row["first_call_ratio"] > 10
    # the mean of the first 10 calls carries the 60 ms first call: about (60 + 9) / 10 ms
    assert row["no_warmup_ms"] >= 6
    assert row["no_warmup_ratio"] > 2


def test_on_the_cpu_no_sync_is_not_a_pitfall():
    row = time_three_ways(slow_first_call(0.002, 0.002), label="even", device="cpu", timing=TIMING)
    assert row["synchronous_device"] is True
    assert 0.3 < row["no_sync_underreport"] < 3  # the CPU finishes the work before the call returns
    assert set(row) >= {"label", "first_call_ms", "no_warmup_ms", "no_sync_ms", "correct_ms", "correct_iqr_ms"}


def test_makers_give_fresh_callables_on_the_cpu():
    fn = matmul_maker(16, torch.float32, "cpu")()
    assert fn().shape == (16, 16)
    gelu = op_maker("gelu", "naive", (1000,), torch.float32, "cpu")()
    assert gelu().shape == (1000,)


@pytest.mark.gpu
def test_on_the_gpu_no_sync_under_reports_a_big_matmul():
    row = time_three_ways(matmul_maker(4096, torch.bfloat16, "cuda"), label="mm", device="cuda", timing=TIMING)
    assert row["synchronous_device"] is False
    assert row["no_sync_underreport"] > 2
