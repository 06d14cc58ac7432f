"""Masks compiled out (EVEN) or not, by warps, for short rows: the package's rows kernel launched directly."""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import explore as X
import torch
import triton

from fuselab.ops.softmax import triton as st


def rows(width, r, w, even):
    block = triton.next_power_of_2(width)

    def fn(x, y):
        st._forward_rows_kernel[(triton.cdiv(x.shape[0], r),)](
            x, y, x.shape[0], width, x.stride(0), y.stride(0), ROWS=r, BLOCK=block, EVEN=even,
            HOLD=False, PTX=False, ALIGN=1, num_warps=w,  # PTX False: tl.exp, as when it ran
        )  # fmt: skip

    return fn


for rep in range(2):
    for dtype, width, warps in (
        (torch.bfloat16, 128, (2, 4)),
        (torch.bfloat16, 256, (2, 4)),
        (torch.bfloat16, 512, (2, 4)),
        (torch.bfloat16, 1024, (4,)),
        (torch.bfloat16, 2048, (4,)),
        (torch.bfloat16, 4096, (4, 8)),
        (torch.bfloat16, 8192, (16,)),
        (torch.float32, 128, (1, 4)),
        (torch.float32, 512, (1, 2)),
        (torch.float32, 1024, (1, 2)),
        (torch.float32, 4096, (16,)),
    ):
        r = max(1, 4096 // (width * dtype.itemsize))
        X.record("even", dtype, width, "torch", lambda x, y: torch.softmax(x, -1))
        for w in warps:
            for even in (1, 0):
                X.record("even", dtype, width, f"rows R{r} w{w} EVEN={even}", rows(width, r, w, even), rep=rep)
print(f"done in {time.time() - X.T0:.0f}s")
