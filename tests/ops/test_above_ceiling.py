"""No rate past a ceiling goes unflagged: % of the copy ceiling, of a copy of the same bytes, of the matmul peak."""

import json

import pytest

from fuselab.bench import ceilings
from fuselab.evaluate import ABOVE_CEILING_NOTE, ABOVE_CEILING_PCT, ABOVE_PEAK_NOTE, Selection, above_ceiling, bench_op
from fuselab.ops import get_op

QUICK = {"timing": {"rep_ms": 2, "warmup_ms": 1}, "call_cost_ms": 0}


@pytest.fixture
def low_ceilings(tmp_path, monkeypatch):
    """Cached ceilings far below what the CPU does (as a busy measurement once left them): every rate passes them."""
    monkeypatch.setenv("FUSELAB_CACHE", str(tmp_path / "cache"))
    path = ceilings.cache_dir() / f"{ceilings.cache_key('cpu')}.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"copy_gbps": 1e-6, "matmul_tflops": {"fp32": 1e-9}, "quick": False}))


def test_a_compute_bound_rate_past_the_matmul_peak_is_flagged_on_the_row(low_ceilings):
    """Attention's TFLOP/s on the CPU against a matmul peak far below it: the row's pct_peak is past
    ABOVE_CEILING_PCT and a warning says what that means (bf16 attention read 3987% of the bf16 peak, unflagged)."""
    sdpa = Selection(
        impls=["sdpa"], dtypes=["float32"], shapes=[(1, 2, 64, 32)], options={"causal": False}, device="cpu"
    )
    (row,) = bench_op(get_op("attention"), sdpa, **QUICK)
    assert row.measured and row.pct_peak > ABOVE_CEILING_PCT
    assert above_ceiling(row) == (pytest.approx(row.pct_peak), "pct_peak")
    assert f"{row.pct_peak:.0f}% of {ABOVE_PEAK_NOTE}" in row.warnings


def test_a_memory_bound_rate_is_held_to_the_copy_ceiling_not_the_matmul_peak(low_ceilings):
    """Softmax's row passes the (low) copy ceiling and says so once; its few FLOPs are not held to the matmul peak."""
    torch_impl = Selection(impls=["torch"], dtypes=["float32"], shapes=[(8, 128)], device="cpu")
    (row,) = bench_op(get_op("softmax"), torch_impl, **QUICK)
    assert row.measured and row.pct_copy > ABOVE_CEILING_PCT and row.pct_peak > ABOVE_CEILING_PCT
    assert above_ceiling(row)[1] in ("pct_copy", "pct_copy_same")
    past = [w for w in row.warnings if w.endswith((ABOVE_CEILING_NOTE, ABOVE_PEAK_NOTE))]
    assert past == [f"{max(row.pct_copy, row.pct_copy_same):.0f}% of {ABOVE_CEILING_NOTE}"]
