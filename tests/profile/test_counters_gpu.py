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


def test_attention_forward_and_backward_kernels_under_ncu(tmp_path):
    """--backward: the Triton attention's forward and both backward kernels each get counters (tensor pipe,
    occupancy, stalls) beside cuDNN's, against the forward + backward cost model."""
    result = cn.profile_counters(
        "attention", ["triton", "sdpa-cudnn"], (2, 4, 777, 64), "bfloat16", {"causal": True}, out_dir=tmp_path,
        backward=True,
    )  # fmt: skip
    ours, cudnn = result.rows
    assert not ours["error"] and not cudnn["error"] and ours["backward"] and cudnn["backward"]
    names = " ".join(k["name"] for k in ours["kernels"])
    for kernel in ("attention_fwd", "attention_bwd_dkdv", "attention_bwd_dq"):
        assert kernel in names, names
    assert "attention_bwd_delta" not in names, names  # the dQ kernel computes delta (`delta_in_dq`)
    assert cudnn["n_kernels"] >= 2, [k["name"] for k in cudnn["kernels"]]  # its forward and its backward
    forward_only = cn.profile_counters("attention", ["triton"], (2, 4, 777, 64), "bfloat16", {"causal": True})
    assert ours["model_flops"] > 2 * forward_only.rows[0]["model_flops"]
    ours_kernels = [k for k in ours["kernels"] if "attention_" in k["name"]]
    assert all(k["tensor_pct"] is not None and k["occupancy_pct"] is not None for k in ours_kernels)
