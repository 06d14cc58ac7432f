"""Sixth round: register caps (ptxas maxnreg, `Plan.maxnreg`) on the rows kernels, so more programs fit on an SM
(round 5: bf16 16384 at 16 warps capped to 40 registers, 3 programs per SM instead of 2, moved 3860 GB/s against
3674). Each capped plan next to the package's choice, which is timed again at the end of each width."""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import explore as X
import torch
import triton

from fuselab.ops.softmax import triton as st

bf16, f32 = torch.bfloat16, torch.float32
# (dtype, width): [(kernel, rows per program, warps, maxnreg), ...]
CASES = {
    (bf16, 16384): [("rows", 1, 16, 40), ("rows", 1, 16, 44), ("rows", 1, 16, 36), ("rows", 1, 16, 32),
                    ("rows", 1, 32, 32), ("rows", 1, 8, 80)],
    (bf16, 32768): [("rows", 1, 16, 64), ("rows", 1, 32, 32), ("rows_ahead", 1, 32, None), ("rows_ahead", 1, 16, 80),
                    ("rows", 1, 16, 80)],
    (bf16, 8192): [("rows", 1, 8, 40), ("rows", 1, 8, 48), ("rows", 1, 16, 28), ("rows", 1, 4, 64)],
    (bf16, 4096): [("rows", 1, 4, 40), ("rows", 1, 4, 44), ("rows", 1, 8, 32), ("rows", 2, 8, 40)],
    (bf16, 512): [("rows", 4, 4, 32), ("rows", 4, 2, 32), ("rows", 8, 4, 40), ("rows", 8, 8, 32)],
    (bf16, 128): [("rows", 16, 4, 32), ("rows", 16, 4, 40)],
    (f32, 32768): [("rows", 1, 32, 32), ("rows", 1, 16, 64), ("rows", 1, 16, 80)],
    (f32, 16384): [("rows", 1, 32, 32), ("rows", 1, 16, 32), ("rows", 1, 16, 40), ("rows", 1, 16, 64)],
    (f32, 8192): [("rows", 1, 16, 32), ("rows", 1, 8, 40), ("rows", 1, 8, 48)],
    (f32, 4096): [("rows", 1, 16, 24), ("rows", 1, 8, 32), ("rows", 1, 4, 48)],
}  # fmt: skip


def plan_fn(plan):
    return lambda x, y: st.launch_forward(x, y, plan)


for (dtype, width), configs in CASES.items():
    if time.time() - X.T0 > X.args.budget_s:
        print("budget spent; stopping", flush=True)
        break
    block = triton.next_power_of_2(width)
    X.record("cap", dtype, width, "chosen " + str(st.forward_plan(width, dtype, X.dev)), plan_fn(None))
    for kernel, rows, warps, cap in configs:
        plan = st.Plan(kernel, block, rows, warps, cap)
        X.record("cap", dtype, width, f"{kernel} R{rows} w{warps} maxnreg {cap}", X.checked(plan_fn(plan), dtype))
    X.record("cap", dtype, width, "chosen again", plan_fn(None))
print(f"done in {time.time() - X.T0:.0f}s")
