"""Hardware counters on a real GPU under ncu (selected with `pytest -m gpu`; skipped without a GPU or ncu)."""

from __future__ import annotations

import pytest

from fuselab.cli import main
from fuselab.profile import counters as cn

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _needs_counters():
    reason = cn.counters_unavailable("cuda")
    if reason:
        pytest.skip(reason)


def test_naive_gelu_moves_more_than_the_fused_kernel(tmp_path):
    n = 2**24 + 3  # larger than L2 (and odd), so the fused kernel's bytes reach DRAM
    result = cn.profile_counters("gelu", ["naive", "torch"], (n,), out_dir=tmp_path)
    naive, torch_row = result.rows
    assert not naive["error"] and not torch_row["error"]
    assert torch_row["n_kernels"] == 1 and naive["n_kernels"] >= 4  # the unfused chain: one kernel per operator
    assert naive["dram_bytes"] > 3 * torch_row["dram_bytes"]
    assert 0.5 < torch_row["dram_read"] / (4 * n) < 1.1  # the input is read once (minus what L2 may still hold)
    assert torch_row["kernels"][0]["bound"] == "memory"
    assert (tmp_path / "counters.json").exists() and (tmp_path / "counters.ncu-rep").exists()


def test_cli_counters_runs(tmp_path, capsys):
    rc = main(
        ["profile", "softmax", "--impl", "torch,triton", "--shape", "1000x3000", "--counters", "--out", str(tmp_path)]
    )
    out = capsys.readouterr().out
    assert rc == 0 and "x the minimum" in out and "bound" in out
