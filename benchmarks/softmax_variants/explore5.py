"""Fifth round: the package's persistent one-tile-ahead rows kernel (`rows_ahead`, from round 4) against the rows
kernel where it is chosen (16-bit rows of 32768) and where it is not (fp32 16384-32768, bf16 16384, odd widths);
and register caps (ptxas maxnreg: more programs per SM) on the rows kernel at bf16 4096 and 16384."""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import explore as X
import torch
import triton

from fuselab.ops.softmax import triton as st


def plan_fn(plan):
    return lambda x, y: st.launch_forward(x, y, plan)


def capped(width, warps, maxnreg):
    block = triton.next_power_of_2(width)

    def fn(x, y):
        st._forward_rows_kernel[(x.shape[0],)](
            x, y, x.shape[0], width, x.stride(0), y.stride(0), ROWS=1, BLOCK=block, EVEN=False,
            HOLD=False, PTX=False, ALIGN=1, num_warps=warps, maxnreg=maxnreg,  # PTX False: tl.exp, as it ran
        )  # fmt: skip

    return fn


bf16, f16, f32 = torch.bfloat16, torch.float16, torch.float32
for dtype, width in ((bf16, 32768), (f16, 32768), (bf16, 24000), (bf16, 16384), (f32, 16384), (f32, 32768)):
    block = triton.next_power_of_2(width)
    X.record("ahead", dtype, width, "torch", lambda x, y: torch.softmax(x, -1))
    X.record("ahead", dtype, width, "chosen " + str(st.forward_plan(width, dtype, X.dev)), plan_fn(None))
    for warps in (16, 32):
        X.record("ahead", dtype, width, f"rows w{warps}", plan_fn(st.Plan("rows", block, 1, warps)))
        X.record(
            "ahead",
            dtype,
            width,
            f"rows_ahead w{warps}",
            X.checked(plan_fn(st.Plan("rows_ahead", block, 1, warps)), dtype),
        )
for width, configs in ((4096, [(4, 32), (4, 40), (8, 24), (8, 32)]), (16384, [(16, 40), (16, 48), (8, 64)])):
    X.record("cap", bf16, width, "chosen " + str(st.forward_plan(width, bf16, X.dev)), plan_fn(None))
    for warps, cap in configs:
        X.record("cap", bf16, width, f"rows w{warps} maxnreg {cap}", capped(width, warps, cap))
    X.record("cap", bf16, width, "chosen again", plan_fn(None))
print(f"done in {time.time() - X.T0:.0f}s")
