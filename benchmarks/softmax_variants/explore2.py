"""Second round: pipelined looped kernel, split packed at mid widths and with fewer warps, cache modifiers at
short fp32 rows, and what torch.compile's kernel is at fp32 512/1024 (Inductor's cache lands in $OUT)."""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import explore as X
import kernels as ek
import torch
import triton

from fuselab.ops.softmax import triton as st
from fuselab.ops.softmax.naive import softmax_naive

record, split, packed, dev, SMS = X.record, X.split, X.packed, X.dev, X.SMS


def cm(width, r, w, lcm, scm):
    block = triton.next_power_of_2(width)

    def fn(x, y):
        ek.rows_cm_kernel[(triton.cdiv(x.shape[0], r),)](
            x,
            y,
            x.shape[0],
            width,
            x.stride(0),
            y.stride(0),
            ROWS=r,
            BLOCK=block,
            LOAD_CM=lcm,
            STORE_CM=scm,
            num_warps=w,
        )

    return fn


def looped(width, block, warps, stages):
    def fn(x, y):
        ek.looped_pipe_kernel[(x.shape[0],)](
            x, y, width, x.stride(0), y.stride(0), BLOCK=block, STAGES=stages, num_warps=warps
        )

    return fn


f32, bf16 = torch.float32, torch.bfloat16
# 1. short fp32 rows against torch.compile
for width in (512, 1024):
    torch._dynamo.reset()
    f = torch.compile(softmax_naive, dynamic=False)
    record("short", f32, width, "compile", lambda x, y, f=f: f(x))
    record("short", f32, width, "shipped", lambda x, y: st.launch_forward(x, y))
    for r, w in ((1, 1), (1, 2), (2, 1), (2, 2), (4, 2)):
        if r * width > 4096:
            continue
        for lcm, scm in (("", ""), ("", ".cs"), (".cg", "")):
            record("short", f32, width, f"rows R{r} w{w} load{lcm or '-'} store{scm or '-'}", cm(width, r, w, lcm, scm))
    record("short", f32, width, "compile again", lambda x, y, f=f: f(x))
# 2. bf16 mid and wide rows
for width in (16384, 32768, 4096, 262144, 131072, 65536):
    if time.time() - X.T0 > X.args.budget_s:
        break
    record("mid", bf16, width, "shipped", lambda x, y: st.launch_forward(x, y))
    for block in (1024, 2048, 4096, 8192):
        for warps in (4, 8):
            if block // (32 * warps) < 4 or block // (32 * warps) > 32:
                continue
            for stages in (2, 3):
                record(
                    "mid", bf16, width, f"looped pipe B{block} w{warps} S{stages}", looped(width, block, warps, stages)
                )
    for chunk in (2048, 4096, 8192, 16384):
        if not 1 < triton.cdiv(width, chunk) <= SMS:
            continue
        for w in (1, 2, 4, 8):
            pairs_per_thread = chunk // 2 // (32 * w)
            if not 4 <= pairs_per_thread <= 64:
                continue
            record("mid", bf16, width, f"split packed C{chunk} w{w}", split(width, chunk, w, 1))
for width in (32768, 65536, 262144):
    if time.time() - X.T0 > X.args.budget_s:
        break
    record("mid", f32, width, "shipped", lambda x, y: st.launch_forward(x, y))
    for block, warps, stages in ((2048, 4, 3), (4096, 8, 3), (4096, 4, 3), (8192, 8, 2), (4096, 8, 4)):
        record("mid", f32, width, f"looped pipe B{block} w{warps} S{stages}", looped(width, block, warps, stages))
print(f"done in {time.time() - X.T0:.0f}s")
