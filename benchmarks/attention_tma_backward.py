"""A study for issue 25: the attention backward's two kernels (dK/dV, dQ) reading every tile of Q, K, V and dO
through TMA tensor descriptors, against the pointer kernels fuselab ships (ops/attention/triton_kernels.py), on the
GPU, side by side: bitwise agreement and GPU time (CUDA-graph replays) per plan.

The kernels are the shipped ones with each tile load a descriptor load (the copy engine zero-fills past the edges,
so only the scores keep their masks) and each store a descriptor store; lse and delta stay pointer loads. On the
H200 (2026-12-02) they gave the pointer kernels' gradients bitwise and took 0.85-0.98x their time at 5 of 6 shapes
(docs/ops/attention.md); the next step is to move them into triton_kernels.py behind tk.tma_ready, as the forward.

    PYTHONPATH=src python3 benchmarks/attention_tma_backward.py --out tma_backward.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from pathlib import Path

import torch
import triton
import triton.language as tl

from fuselab.bench.env import environment
from fuselab.ops.attention import triton_kernels as tk

SHAPES = [  # (Z, Hq, Hkv, N, d, causal): the leaderboard, a GPT block, d 128, GQA d 96, d 64 full, d 80
    (16, 1, 1, 16384, 64, True),
    (8, 12, 12, 1024, 64, True),
    (2, 16, 16, 8192, 128, True),
    (4, 16, 4, 4096, 96, True),
    (4, 32, 32, 4096, 64, False),
    (8, 16, 8, 2048, 80, True),
]
PLANS = {  # each kernel's candidates beside its shipped plan (None)
    "dkdv": [None, tk.Plan(32, 64, 4, 3), tk.Plan(64, 64, 4, 3), tk.Plan(64, 128, 8, 2), tk.Plan(32, 128, 4, 3)],
    "dq": [None, tk.Plan(64, 64, 4, 3), tk.Plan(128, 64, 8, 3), tk.Plan(128, 128, 8, 2)],
}


@triton.jit
def _dkdv_inner(
    dk_a,
    dk_b,
    dv_a,
    dv_b,
    k_a,
    k_b,
    v_a,
    v_b,
    qd_a,
    qd_b,
    dod_a,
    dod_b,
    z,
    h,
    lse_base,
    delta_base,
    offs_n,
    rows,
    lo,
    hi,
    NQ,
    qk_scale,
    BLOCK_M: tl.constexpr,
    DA: tl.constexpr,
    DB: tl.constexpr,
    MASKED: tl.constexpr,
    CAUSAL: tl.constexpr,
    SPLIT: tl.constexpr,
    PREC: tl.constexpr,
):
    for start_m in range(lo, hi, BLOCK_M):
        offs_m = start_m + rows
        in_m = offs_m < NQ
        q_a = qd_a.load([z, h, start_m, 0]).reshape(BLOCK_M, DA)
        do_a = dod_a.load([z, h, start_m, 0]).reshape(BLOCK_M, DA)
        if MASKED:
            lse = tl.load(lse_base + offs_m, mask=in_m, other=0.0)
            delta = tl.load(delta_base + offs_m, mask=in_m, other=0.0)
        else:
            lse = tl.load(lse_base + offs_m)
            delta = tl.load(delta_base + offs_m)
        st = tl.dot(k_a, tl.trans(q_a), input_precision=PREC)
        if SPLIT:
            q_b = qd_b.load([z, h, start_m, DA]).reshape(BLOCK_M, DB)
            do_b = dod_b.load([z, h, start_m, DA]).reshape(BLOCK_M, DB)
            st = tl.dot(k_b, tl.trans(q_b), st, input_precision=PREC)
        pt = tl.math.exp2(st * qk_scale - (lse * 1.4426950408889634)[None, :])
        if MASKED:
            keep = in_m[None, :]
            if CAUSAL:
                keep = keep & (offs_m[None, :] >= offs_n[:, None])
            pt = tl.where(keep, pt, 0.0)
        pt16 = pt.to(do_a.dtype)
        dv_a = tl.dot(pt16, do_a, dv_a, input_precision=PREC)
        dpt = tl.dot(v_a, tl.trans(do_a), input_precision=PREC)
        if SPLIT:
            dv_b = tl.dot(pt16, do_b, dv_b, input_precision=PREC)
            dpt = tl.dot(v_b, tl.trans(do_b), dpt, input_precision=PREC)
        dst = (pt * (dpt - delta[None, :])).to(q_a.dtype)
        dk_a = tl.dot(dst, q_a, dk_a, input_precision=PREC)
        if SPLIT:
            dk_b = tl.dot(dst, q_b, dk_b, input_precision=PREC)
    return dk_a, dk_b, dv_a, dv_b


@triton.jit(do_not_specialize=["NQ", "NK", "NUM_N", "GROUP"])
def dkdv_tma_kernel(
    qd_a,
    qd_b,
    kd_a,
    kd_b,
    vd_a,
    vd_b,
    dod_a,
    dod_b,
    LSE,
    DELTA,
    dkd_a,
    dkd_b,
    dvd_a,
    dvd_b,
    HKV,
    GROUP,
    NQ,
    NK,
    NUM_N,
    qk_scale,
    sm_scale,
    DA: tl.constexpr,
    DB: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    PREC: tl.constexpr,
):
    SPLIT: tl.constexpr = DB > 0
    qk_scale, sm_scale = tl.cast(qk_scale, tl.float32), tl.cast(sm_scale, tl.float32)
    pid = tl.program_id(0)
    bh = pid // NUM_N
    n0 = (pid % NUM_N) * BLOCK_N
    z = bh // HKV
    hk = bh % HKV
    offs_n = n0 + tl.arange(0, BLOCK_N)
    rows = tl.arange(0, BLOCK_M)
    k_a = kd_a.load([z, hk, n0, 0]).reshape(BLOCK_N, DA)
    v_a = vd_a.load([z, hk, n0, 0]).reshape(BLOCK_N, DA)
    dk_a = tl.zeros([BLOCK_N, DA], dtype=tl.float32)
    dv_a = tl.zeros([BLOCK_N, DA], dtype=tl.float32)
    if SPLIT:
        k_b = kd_b.load([z, hk, n0, DA]).reshape(BLOCK_N, DB)
        v_b = vd_b.load([z, hk, n0, DA]).reshape(BLOCK_N, DB)
        dk_b = tl.zeros([BLOCK_N, DB], dtype=tl.float32)
        dv_b = tl.zeros([BLOCK_N, DB], dtype=tl.float32)
    else:
        k_b, v_b, dk_b, dv_b = k_a, v_a, dk_a, dv_a
    nq_whole = (NQ // BLOCK_M) * BLOCK_M
    if CAUSAL:
        lo = (n0 // BLOCK_M) * BLOCK_M
        full_lo = tl.minimum(tl.cdiv(n0 + BLOCK_N - 1, BLOCK_M) * BLOCK_M, nq_whole)
        full_lo = tl.maximum(full_lo, lo)
    else:
        lo = 0
        full_lo = 0
    g = tl.full((), 0, tl.int32)
    while g < GROUP:
        h = hk * GROUP + g
        lse_base = LSE + (z * HKV * GROUP + h).to(tl.int64) * NQ
        delta_base = DELTA + (z * HKV * GROUP + h).to(tl.int64) * NQ
        if CAUSAL:
            dk_a, dk_b, dv_a, dv_b = _dkdv_inner(
                dk_a,
                dk_b,
                dv_a,
                dv_b,
                k_a,
                k_b,
                v_a,
                v_b,
                qd_a,
                qd_b,
                dod_a,
                dod_b,
                z,
                h,
                lse_base,
                delta_base,
                offs_n,
                rows,
                lo,
                full_lo,
                NQ,
                qk_scale,
                BLOCK_M,
                DA,
                DB,
                True,
                True,
                SPLIT,
                PREC,
            )
        dk_a, dk_b, dv_a, dv_b = _dkdv_inner(
            dk_a,
            dk_b,
            dv_a,
            dv_b,
            k_a,
            k_b,
            v_a,
            v_b,
            qd_a,
            qd_b,
            dod_a,
            dod_b,
            z,
            h,
            lse_base,
            delta_base,
            offs_n,
            rows,
            full_lo,
            nq_whole,
            NQ,
            qk_scale,
            BLOCK_M,
            DA,
            DB,
            False,
            False,
            SPLIT,
            PREC,
        )
        dk_a, dk_b, dv_a, dv_b = _dkdv_inner(
            dk_a,
            dk_b,
            dv_a,
            dv_b,
            k_a,
            k_b,
            v_a,
            v_b,
            qd_a,
            qd_b,
            dod_a,
            dod_b,
            z,
            h,
            lse_base,
            delta_base,
            offs_n,
            rows,
            tl.maximum(nq_whole, full_lo),
            NQ,
            NQ,
            qk_scale,
            BLOCK_M,
            DA,
            DB,
            True,
            CAUSAL,
            SPLIT,
            PREC,
        )
        g += 1
    dkd_a.store([z, hk, n0, 0], (dk_a * sm_scale).to(dkd_a.dtype).reshape(1, 1, BLOCK_N, DA))
    dvd_a.store([z, hk, n0, 0], dv_a.to(dvd_a.dtype).reshape(1, 1, BLOCK_N, DA))
    if SPLIT:
        dkd_b.store([z, hk, n0, DA], (dk_b * sm_scale).to(dkd_b.dtype).reshape(1, 1, BLOCK_N, DB))
        dvd_b.store([z, hk, n0, DA], dv_b.to(dvd_b.dtype).reshape(1, 1, BLOCK_N, DB))


@triton.jit
def _dq_inner(
    dq_a,
    dq_b,
    q_a,
    q_b,
    do_a,
    do_b,
    lse,
    delta,
    kd_a,
    kd_b,
    vd_a,
    vd_b,
    z,
    hk,
    offs_m,
    offs_n,
    lo,
    hi,
    NK,
    qk_scale,
    BLOCK_N: tl.constexpr,
    DA: tl.constexpr,
    DB: tl.constexpr,
    MASKED: tl.constexpr,
    CAUSAL: tl.constexpr,
    SPLIT: tl.constexpr,
    PREC: tl.constexpr,
):
    for start_n in range(lo, hi, BLOCK_N):
        k_a = kd_a.load([z, hk, start_n, 0]).reshape(BLOCK_N, DA)
        v_a = vd_a.load([z, hk, start_n, 0]).reshape(BLOCK_N, DA)
        s = tl.dot(q_a, tl.trans(k_a), input_precision=PREC)
        dp = tl.dot(do_a, tl.trans(v_a), input_precision=PREC)
        if SPLIT:
            k_b = kd_b.load([z, hk, start_n, DA]).reshape(BLOCK_N, DB)
            v_b = vd_b.load([z, hk, start_n, DA]).reshape(BLOCK_N, DB)
            s = tl.dot(q_b, tl.trans(k_b), s, input_precision=PREC)
            dp = tl.dot(do_b, tl.trans(v_b), dp, input_precision=PREC)
        p = tl.math.exp2(s * qk_scale - lse[:, None])
        if MASKED:
            keep = ((start_n + offs_n) < NK)[None, :]
            if CAUSAL:
                keep = keep & ((start_n + offs_n)[None, :] <= offs_m[:, None])
            p = tl.where(keep, p, 0.0)
        ds = (p * (dp - delta[:, None])).to(k_a.dtype)
        dq_a = tl.dot(ds, k_a, dq_a, input_precision=PREC)
        if SPLIT:
            dq_b = tl.dot(ds, k_b, dq_b, input_precision=PREC)
    return dq_a, dq_b


@triton.jit(do_not_specialize=["NQ", "NK", "NUM_M", "GROUP"])
def dq_tma_kernel(
    qd_a,
    qd_b,
    kd_a,
    kd_b,
    vd_a,
    vd_b,
    dod_a,
    dod_b,
    LSE,
    DELTA,
    dqd_a,
    dqd_b,
    HQ,
    GROUP,
    NQ,
    NK,
    NUM_M,
    qk_scale,
    sm_scale,
    DA: tl.constexpr,
    DB: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    PREC: tl.constexpr,
):
    SPLIT: tl.constexpr = DB > 0
    qk_scale, sm_scale = tl.cast(qk_scale, tl.float32), tl.cast(sm_scale, tl.float32)
    pid = tl.program_id(0)
    bh = pid // NUM_M
    start_m = pid % NUM_M
    if CAUSAL:
        start_m = NUM_M - 1 - start_m
    z = bh // HQ
    h = bh % HQ
    hk = h // GROUP
    m0 = start_m * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    in_m = offs_m < NQ
    lse = tl.load(LSE + bh.to(tl.int64) * NQ + offs_m, mask=in_m, other=0.0) * 1.4426950408889634
    delta = tl.load(DELTA + bh.to(tl.int64) * NQ + offs_m, mask=in_m, other=0.0)
    q_a = qd_a.load([z, h, m0, 0]).reshape(BLOCK_M, DA)
    do_a = dod_a.load([z, h, m0, 0]).reshape(BLOCK_M, DA)
    dq_a = tl.zeros([BLOCK_M, DA], dtype=tl.float32)
    if SPLIT:
        q_b = qd_b.load([z, h, m0, DA]).reshape(BLOCK_M, DB)
        do_b = dod_b.load([z, h, m0, DA]).reshape(BLOCK_M, DB)
        dq_b = tl.zeros([BLOCK_M, DB], dtype=tl.float32)
    else:
        q_b, do_b, dq_b = q_a, do_a, dq_a
    nk_whole = (NK // BLOCK_N) * BLOCK_N
    if CAUSAL:
        full_hi = tl.minimum(((m0 + 1) // BLOCK_N) * BLOCK_N, nk_whole)
        hi = tl.minimum(m0 + BLOCK_M, NK)
    else:
        full_hi = nk_whole
        hi = NK
    dq_a, dq_b = _dq_inner(
        dq_a,
        dq_b,
        q_a,
        q_b,
        do_a,
        do_b,
        lse,
        delta,
        kd_a,
        kd_b,
        vd_a,
        vd_b,
        z,
        hk,
        offs_m,
        offs_n,
        0,
        full_hi,
        NK,
        qk_scale,
        BLOCK_N,
        DA,
        DB,
        False,
        CAUSAL,
        SPLIT,
        PREC,
    )
    dq_a, dq_b = _dq_inner(
        dq_a,
        dq_b,
        q_a,
        q_b,
        do_a,
        do_b,
        lse,
        delta,
        kd_a,
        kd_b,
        vd_a,
        vd_b,
        z,
        hk,
        offs_m,
        offs_n,
        full_hi,
        hi,
        NK,
        qk_scale,
        BLOCK_N,
        DA,
        DB,
        True,
        CAUSAL,
        SPLIT,
        PREC,
    )
    dqd_a.store([z, h, m0, 0], (dq_a * sm_scale).to(dqd_a.dtype).reshape(1, 1, BLOCK_M, DA))
    if SPLIT:
        dqd_b.store([z, h, m0, DA], (dq_b * sm_scale).to(dqd_b.dtype).reshape(1, 1, BLOCK_M, DB))


def backward(
    do: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    causal: bool,
    scale: float,
    dkdv_plan: tk.Plan | None = None,
    dq_plan: tk.Plan | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """tk.backward's contract for (Z, H, N, d) 16-bit tensors whose strides TMA can address (tk.tma_ready)."""
    do = do.to(q.dtype).contiguous()  # descriptors want a unit last stride and 16-byte row strides
    z, hq, nq, d = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    dq = torch.empty_like(q)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    if dk.numel() > 0 and nq == 0:
        dk.zero_()
        dv.zero_()
    if nk == 0:  # descriptors take no empty dim; no keys: dQ = 0
        dq.zero_()
    if dq.numel() == 0 or nk == 0:
        return dq, dk, dv
    delta = torch.empty((z, hq, nq), dtype=torch.float32, device=q.device)
    lse = lse.reshape(z, hq, nq)
    block = 16 if tk.INTERPRET else 64
    num = triton.cdiv(nq, block)
    tk.attention_bwd_delta_kernel[(num * z * hq,)](
        o,
        do,
        delta,
        *o.stride(),
        *do.stride(),
        hq,
        nq,
        num,
        HEAD_DIM=d,
        D_PAD=tk.d_pad(d),
        BLOCK_M=block,
        num_warps=1 if tk.INTERPRET else 4,
        num_stages=1,
    )
    prec = tk._precision(q.dtype)
    da, db = tk.d_chunks(d)
    plan = dkdv_plan or tk.choose_plan("dkdv", d, q.dtype, causal, q.device, nq, nk, z * hkv)
    num = triton.cdiv(tk.seen_keys(nq, nk, causal), plan.block_n)
    if num * plan.block_n < nk:
        dk[:, :, num * plan.block_n :].zero_()
        dv[:, :, num * plan.block_n :].zero_()
    dkdv_tma_kernel[(num * z * hkv,)](
        *tk._descriptors(q, plan.block_m, da, db),
        *tk._descriptors(k, plan.block_n, da, db),
        *tk._descriptors(v, plan.block_n, da, db),
        *tk._descriptors(do, plan.block_m, da, db),
        lse,
        delta,
        *tk._descriptors(dk, plan.block_n, da, db),
        *tk._descriptors(dv, plan.block_n, da, db),
        hkv,
        hq // hkv,
        nq,
        nk,
        num,
        scale * tk.LOG2E,
        scale,
        DA=da,
        DB=db,
        BLOCK_M=plan.block_m,
        BLOCK_N=plan.block_n,
        CAUSAL=causal,
        PREC=prec,
        num_warps=plan.warps,
        num_stages=plan.stages,
    )
    plan = dq_plan or tk.choose_plan("dq", d, q.dtype, causal, q.device, nq, nk, z * hq)
    num = triton.cdiv(nq, plan.block_m)
    dq_tma_kernel[(num * z * hq,)](
        *tk._descriptors(q, plan.block_m, da, db),
        *tk._descriptors(k, plan.block_n, da, db),
        *tk._descriptors(v, plan.block_n, da, db),
        *tk._descriptors(do, plan.block_m, da, db),
        lse,
        delta,
        *tk._descriptors(dq, plan.block_m, da, db),
        hq,
        hq // hkv,
        nq,
        nk,
        num,
        scale * tk.LOG2E,
        scale,
        DA=da,
        DB=db,
        BLOCK_M=plan.block_m,
        BLOCK_N=plan.block_n,
        CAUSAL=causal,
        PREC=prec,
        num_warps=plan.warps,
        num_stages=plan.stages,
    )
    return dq, dk, dv


def measure(z: int, hq: int, hkv: int, n: int, d: int, causal: bool, rep_ms: float) -> dict:
    """One shape, bf16: whether the TMA kernels' dQ, dK, dV equal the shipped ones bitwise, and the backward's GPU
    time (ms) with the pointer kernels and with the TMA kernels at each plan of PLANS."""
    from triton.testing import do_bench_cudagraph

    gen = torch.Generator(device="cuda").manual_seed(0)
    q, do = (torch.randn(z, hq, n, d, device="cuda", generator=gen).bfloat16() for _ in range(2))
    k, v = (torch.randn(z, hkv, n, d, device="cuda", generator=gen).bfloat16() for _ in range(2))
    scale = d**-0.5
    o, lse = tk.forward(q, k, v, causal, scale)
    shipped = tk.backward(do, q, k, v, o, lse, causal, scale)
    ours = backward(do, q, k, v, o, lse, causal, scale)
    row = {
        "shape": [z, hq, hkv, n, d],
        "causal": causal,
        "bitwise_equal": [torch.equal(a, b) for a, b in zip(ours, shipped, strict=True)],
        "pointer_ms": do_bench_cudagraph(lambda: tk.backward(do, q, k, v, o, lse, causal, scale), rep=rep_ms),
        "tma_ms": {},
    }
    for kernel, plans in PLANS.items():
        for plan in plans:
            chosen = {f"{kernel}_plan": plan}
            try:
                ms = do_bench_cudagraph(lambda c=chosen: backward(do, q, k, v, o, lse, causal, scale, **c), rep=rep_ms)
            except Exception as exc:  # out of shared memory
                ms = f"{type(exc).__name__}: {exc}"[:120]
            row["tma_ms"][f"{kernel} {'shipped' if plan is None else plan}"] = ms
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--rep-ms", type=float, default=30.0, help="each timing's CUDA-graph replays, ms")
    args = p.parse_args()
    rows = []
    for shape in SHAPES:
        rows.append(measure(*shape, rep_ms=args.rep_ms))
        print(json.dumps(rows[-1]), flush=True)
    revision = (
        os.environ.get("FUSELAB_REVISION")
        or subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    )
    record = {"revision": revision, "env": environment("cuda"), "dtype": "bfloat16", "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
