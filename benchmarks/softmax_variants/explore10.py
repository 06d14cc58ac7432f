"""Tenth round: exp as one ex2.approx.ftz (PTX) against tl.exp in the kernels for rows wider than 32768 (split,
split in bf16 pairs, looped), side by side with the package's choice, at fp32 and bf16 widths 65536-262144 and
2^20. The kernels are launched here as `launch_forward` does, with PTX set either way."""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import explore as X
import torch
import triton

from fuselab.ops.softmax import triton as st

bf16, f32 = torch.bfloat16, torch.float32


def launch(plan, ptx):
    def fn(x, y):
        n_rows, n_cols = x.shape
        if plan.kernel == "looped":
            st._forward_looped_kernel[(n_rows,)](
                x, y, n_cols, x.stride(0), y.stride(0), BLOCK=plan.block, PTX=ptx, num_warps=plan.num_warps
            )
            return
        split = triton.cdiv(n_cols, plan.block)
        stats = torch.empty(2, n_rows * split, dtype=torch.float32, device=x.device)
        sync = torch.zeros(1 + n_rows, dtype=torch.int32, device=x.device)
        meta = {"SPLIT": split, "SPLIT_P2": triton.next_power_of_2(split), "num_warps": plan.num_warps, "PTX": ptx}
        if plan.kernel == "split_pairs":
            st._forward_split_pairs_kernel[(n_rows * split,)](
                x, y, stats[0], stats[1], sync, n_cols // 2, x.stride(0) // 2, y.stride(0) // 2,
                CHUNK=plan.block // 2, **meta,
            )  # fmt: skip
        else:
            st._forward_split_kernel[(n_rows * split,)](
                x, y, stats[0], stats[1], sync, n_cols, x.stride(0), y.stride(0), CHUNK=plan.block, **meta
            )

    return fn


for dtype, width in ((f32, 65536), (f32, 262144), (bf16, 65536), (bf16, 262144), (f32, 2**20), (bf16, 2**20)):
    if time.time() - X.T0 > X.args.budget_s:
        print("budget spent; stopping", flush=True)
        break
    chosen = st.forward_plan(width, dtype, X.dev)
    X.record("wide", dtype, width, "chosen " + str(chosen), lambda x, y: st.launch_forward(x, y))
    plans = [chosen, st.Plan("looped", st.LOOP_BLOCK, 1, 8)] if chosen.kernel != "looped" else [chosen]
    for plan in plans:
        for ptx in (False,) if X.DRY else (False, True):  # the interpreter has no inline PTX
            name = f"{plan.kernel} {plan.block} w{plan.num_warps} " + ("ftz" if ptx else "tl.exp")
            X.record("wide", dtype, width, name, X.checked(launch(plan, ptx), dtype))
    X.record("wide", dtype, width, "chosen again", lambda x, y: st.launch_forward(x, y))
print(f"done in {time.time() - X.T0:.0f}s")
