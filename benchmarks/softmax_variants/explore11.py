"""Eleventh round, after the bench of round 10's kernels put bf16 32768 at 91.8% of the copy ceiling and bf16 1024 at
1.002x torch.compile: the rows kernel with masks compiled out (EVEN, so far fp32 only) for held bf16 rows of
16384-32768 and bf16 rows of 1024 at several rows per program and warps, each alternated three times with the
package's choice (and torch.compile at 1024)."""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import explore as X
import torch
import triton

from fuselab.ops.softmax import triton as st
from fuselab.ops.softmax.naive import softmax_naive

bf16 = torch.bfloat16


def rows(plan, even):
    def fn(x, y):
        n_rows, n_cols = x.shape
        a = st._alignment(x, y)
        st._forward_rows_kernel[(triton.cdiv(n_rows, plan.rows),)](
            x, y, n_rows, n_cols // a, x.stride(0) // a, y.stride(0) // a, ROWS=plan.rows, BLOCK=plan.block,
            EVEN=even, HOLD=plan.hold, PTX=not X.DRY, ALIGN=a, num_warps=plan.num_warps, maxnreg=plan.maxnreg,
        )  # fmt: skip

    return fn


CASES = {
    32768: [st.Plan("rows", 32768, 1, 32, hold=True), st.Plan("rows", 32768, 1, 16, hold=True)],
    16384: [st.Plan("rows", 16384, 1, 16, 40, hold=True), st.Plan("rows", 16384, 1, 16, 40)],
    1024: [st.Plan("rows", 1024, 2, 4), st.Plan("rows", 1024, 1, 2), st.Plan("rows", 1024, 1, 4),
           st.Plan("rows", 1024, 4, 8), st.Plan("rows", 1024, 2, 2)],
}  # fmt: skip
torch._dynamo.reset()
compiled = torch.compile(softmax_naive, dynamic=False)
for width, plans in CASES.items():
    for i in range(3):
        if width == 1024:
            X.record("even", bf16, width, f"compile {i}", lambda x, y: compiled(x))
        X.record("even", bf16, width, f"chosen {i}", lambda x, y: st.launch_forward(x, y))
        for plan in plans:
            for even in (False, True):
                name = f"R{plan.rows} w{plan.num_warps} cap {plan.maxnreg} hold {int(plan.hold)} even {int(even)} {i}"
                X.record("even", bf16, width, name, X.checked(rows(plan, even), bf16))
print(f"done in {time.time() - X.T0:.0f}s")
