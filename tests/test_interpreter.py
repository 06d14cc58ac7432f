"""fuselab.interpreter: Triton's interpreter runs a `for` loop to runtime bounds, as the kernels are written."""

from __future__ import annotations

import os

import pytest
import torch

import fuselab  # chooses the interpreter without a GPU, and prepares it

triton = pytest.importorskip("triton")
tl = triton.language


@triton.jit
def _sum_blocks(x, out, lo, hi, BLOCK: tl.constexpr):
    """out[:BLOCK] = the sum of x's blocks from lo to hi (runtime bounds)."""
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(lo, hi, BLOCK):
        acc += tl.load(x + tl.cast(start, tl.int64) + tl.arange(0, BLOCK))
    tl.store(out + tl.arange(0, BLOCK), acc)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the interpreter's own behaviour")
def test_a_for_loop_runs_to_runtime_bounds_under_the_interpreter() -> None:
    x = torch.randn(16 * 7, generator=torch.Generator().manual_seed(0))
    out = torch.empty(16)
    _sum_blocks[(1,)](x, out, 32, 112, BLOCK=16)  # blocks 2..6
    torch.testing.assert_close(out, x.view(7, 16)[2:].sum(0))
    fuselab.interpreter.prepare()  # idempotent
    _sum_blocks[(1,)](x, out, 0, 16, BLOCK=16)
    torch.testing.assert_close(out, x[:16])
