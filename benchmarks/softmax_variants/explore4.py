"""Fourth round: bf16 at widths 512-32768, where the rows kernel missed 92% of the copy ceiling. What a plain copy of
the same 128 MiB moves (torch, and the rows kernel's loads and stores without its math), against the package's plan
and a persistent rows kernel that loads its next tile before the math of this one (as bf16, or held in int32 pairs),
at several programs per SM."""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import explore as X
import kernels as ek
import torch
import triton

from fuselab.ops.softmax import triton as st


def prefetch(width, rows_, warps, per_sm):
    block = triton.next_power_of_2(width)

    def fn(x, y):
        grid = min(triton.cdiv(x.shape[0], rows_), per_sm * X.SMS)
        ek.rows_prefetch_kernel[(grid,)](
            x, y, x.shape[0], width, x.stride(0), y.stride(0), ROWS=rows_, BLOCK=block, num_warps=warps
        )

    return fn


def prefetch_pairs(width, rows_, warps, per_sm):
    pairs = triton.next_power_of_2(width) // 2

    def fn(x, y):
        xi, yi = x.view(torch.int32), y.view(torch.int32)
        grid = min(triton.cdiv(x.shape[0], rows_), per_sm * X.SMS)
        ek.rows_prefetch_pairs_kernel[(grid,)](
            xi, yi, x.shape[0], width // 2, xi.stride(0), yi.stride(0), ROWS=rows_, PAIRS=pairs, num_warps=warps
        )

    return fn


def copy_rows(width, rows_, warps):
    block = triton.next_power_of_2(width)

    def fn(x, y):
        ek.rows_copy_kernel[(triton.cdiv(x.shape[0], rows_),)](
            x, y, x.shape[0], width, x.stride(0), y.stride(0), ROWS=rows_, BLOCK=block, num_warps=warps
        )

    return fn


bf16 = torch.bfloat16
# width: [(rows per tile, warps, programs per SM), ...]
CASES = {
    512: [(4, 4, 4), (4, 4, 8), (4, 4, 16), (4, 2, 8), (4, 2, 16), (8, 4, 4), (8, 4, 8), (8, 8, 4), (2, 2, 16)],
    4096: [(1, 8, 2), (1, 8, 4), (1, 8, 6), (1, 8, 8), (1, 4, 4), (1, 4, 8), (1, 16, 2), (1, 16, 4)],
    8192: [(1, 8, 2), (1, 8, 4), (1, 16, 1), (1, 16, 2), (1, 16, 4), (1, 32, 1)],
    16384: [(1, 16, 1), (1, 16, 2), (1, 32, 1), (1, 8, 2)],
    32768: [(1, 32, 1), (1, 16, 1)],
}
for width, configs in CASES.items():
    if time.time() - X.T0 > X.args.budget_s:
        print("budget spent; stopping", flush=True)
        break
    plan = st.forward_plan(width, bf16, X.dev)
    X.record("ref", bf16, width, "torch copy_", lambda x, y: y.copy_(x), copy=True)
    X.record(
        "ref",
        bf16,
        width,
        f"rows copy R{plan.rows} w{plan.num_warps}",
        copy_rows(width, plan.rows, plan.num_warps),
        copy=True,
    )
    X.record("pre", bf16, width, "torch", lambda x, y: torch.softmax(x, -1))
    X.record("pre", bf16, width, "shipped " + str(plan), lambda x, y: st.launch_forward(x, y))
    for rows_, warps, per_sm in configs:
        name = f"prefetch R{rows_} w{warps} x{per_sm}/SM"
        X.record("pre", bf16, width, name, X.checked(prefetch(width, rows_, warps, per_sm), bf16))
        name = f"prefetch pairs R{rows_} w{warps} x{per_sm}/SM"
        X.record("pre", bf16, width, name, X.checked(prefetch_pairs(width, rows_, warps, per_sm), bf16))
    X.record("pre", bf16, width, "shipped again", lambda x, y: st.launch_forward(x, y))
X.record("ref", torch.float32, 1024, "torch copy_ fp32", lambda x, y: y.copy_(x), copy=True)
print(f"done in {time.time() - X.T0:.0f}s")
