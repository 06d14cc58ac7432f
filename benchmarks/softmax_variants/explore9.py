"""Ninth round, on the package's own kernels after round 8: exp as one ex2.approx.ftz (PTX) against tl.exp ("tl.exp":
the same plan launched with PTX off, as the package ran until then) at every plan the package chose, and the rows
kernel with 16-bit rows held unconverted (`Plan.hold`) against `rows_ahead` and the register-capped rows plans at
bf16/fp16 widths 8192-32768 and odd widths. Then torch.compile against the fp32 1024 plan, alternated three times."""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import explore as X
import torch

from fuselab.ops.softmax import triton as st
from fuselab.ops.softmax.naive import softmax_naive

bf16, f16, f32 = torch.bfloat16, torch.float16, torch.float32
R = st.Plan
# (dtype, width): plans, each timed with PTX off ("tl.exp") and on ("ftz")
CASES = {
    (bf16, 32768): [R("rows_ahead", 32768, 1, 32), R("rows", 32768, 1, 32, hold=True),
                    R("rows", 32768, 1, 16, hold=True)],
    (f16, 32768): [R("rows_ahead", 32768, 1, 32), R("rows", 32768, 1, 32, hold=True)],
    (bf16, 24000): [R("rows_ahead", 32768, 1, 32), R("rows", 32768, 1, 32, hold=True)],
    (bf16, 17000): [R("rows_ahead", 32768, 1, 32), R("rows", 32768, 1, 32, hold=True)],
    (bf16, 16384): [R("rows", 16384, 1, 16, 40), R("rows", 16384, 1, 16, hold=True),
                    R("rows", 16384, 1, 16, 40, hold=True), R("rows", 16384, 1, 8, hold=True)],
    (bf16, 8192): [R("rows", 8192, 1, 16), R("rows", 8192, 1, 8, hold=True), R("rows", 8192, 1, 16, hold=True)],
    (bf16, 4096): [R("rows", 4096, 1, 4), R("rows", 4096, 1, 4, hold=True)],
    (bf16, 1024): [R("rows", 1024, 2, 4)],
    (bf16, 512): [R("rows", 512, 4, 4, 32)],
    (bf16, 128): [R("rows", 128, 16, 4)],
    (f32, 32768): [R("rows", 32768, 1, 32)],
    (f32, 16384): [R("rows", 16384, 1, 32)],
    (f32, 4096): [R("rows", 4096, 1, 16)],
    (f32, 1024): [R("rows", 1024, 1, 1)],
    (f32, 128): [R("rows", 128, 8, 1)],
}  # fmt: skip
interpreted = st._interpreted


def plan_fn(plan, ptx=True):
    """The package launching `plan`; ptx False: as if interpreted, so PTX is off (tl.exp, .to conversions)."""

    def fn(x, y):
        st._interpreted = interpreted if ptx else (lambda: True)
        try:
            st.launch_forward(x, y, plan)
        finally:
            st._interpreted = interpreted

    return fn


for (dtype, width), plans in CASES.items():
    if time.time() - X.T0 > X.args.budget_s:
        print("budget spent; stopping", flush=True)
        break
    X.record("ptx", dtype, width, "chosen " + str(st.forward_plan(width, dtype, X.dev)), plan_fn(None))
    for plan in plans:
        short = f"{plan.kernel} R{plan.rows} w{plan.num_warps} maxnreg {plan.maxnreg} hold {int(plan.hold)}"
        X.record("ptx", dtype, width, short + " tl.exp", X.checked(plan_fn(plan, ptx=False), dtype))
        X.record("ptx", dtype, width, short + " ftz", X.checked(plan_fn(plan), dtype))
    X.record("ptx", dtype, width, "chosen again", plan_fn(None))

torch._dynamo.reset()
compiled = torch.compile(softmax_naive, dynamic=False)
for i in range(3):
    X.record("ab", f32, 1024, f"compile {i}", lambda x, y: compiled(x))
    X.record("ab", f32, 1024, f"chosen {i}", plan_fn(None))
print(f"done in {time.time() - X.T0:.0f}s")
