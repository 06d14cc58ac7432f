"""Third round: the pipelined looped kernel against the package's choice at mid and wide widths."""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import explore as X
import kernels as ek
import torch

from fuselab.ops.softmax import triton as st

record = X.record


def looped(width, block, warps, stages):
    def fn(x, y):
        ek.looped_pipe_kernel[(x.shape[0],)](
            x, y, width, x.stride(0), y.stride(0), BLOCK=block, STAGES=stages, num_warps=warps
        )

    return fn


for dtype, width in (
    (torch.bfloat16, 16384),
    (torch.bfloat16, 32768),
    (torch.bfloat16, 4096),
    (torch.bfloat16, 262144),
    (torch.float32, 65536),
):
    record(
        "loop",
        dtype,
        width,
        "chosen " + str(st.forward_plan(width, dtype, X.dev)),
        lambda x, y: st.launch_forward(x, y),
    )
    for block, warps, stages in ((2048, 4, 3), (4096, 8, 3), (4096, 4, 2), (4096, 4, 3), (8192, 8, 2), (8192, 16, 3)):
        if block > width:
            continue
        record("loop", dtype, width, f"looped pipe B{block} w{warps} S{stages}", looped(width, block, warps, stages))
print(f"done in {time.time() - X.T0:.0f}s")
