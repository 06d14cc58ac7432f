"""FlashAttention-2 forward and backward as Triton kernels (imported lazily: only this module needs Triton).

Layout: every tensor is addressed as (Z, H, N, D) through its four strides, so non-contiguous q, k, v and output
gradients are read in place; a gradient with a stride 0 (`o.sum().backward()`) or a non-unit last stride is copied
to contiguous first (the H200 run read the leaderboard step's stride-0 gradient in place: 6.68 ms, against ~5.45 ms
expected from the same kernels at (1, 32, 16384, 64); the copy is not measured yet). The head dim is padded to
D_PAD, the next power of two (>= 16), with masks when it differs. Each program's (batch, head) base offset and
row-block offset are 64-bit; offsets inside a tile are 32-bit.

Forward (one program per BLOCK_M queries of one head): the query tile stays in registers, key/value tiles of BLOCK_N
stream past; online softmax in base 2 with log2(e) folded into the scale; per row it writes O and the logsumexp
L = (m + log2 l) * ln 2 (natural log, float32). The key range is split in two loops: whole key blocks that need no
mask at all, then the few that do (the causal diagonal, and the ragged last block); key blocks wholly above the
diagonal are never visited.

Backward (deterministic, no atomics): `_bwd_delta` computes delta = rowsum(dO * O); `_bwd_dkdv` gives one program
BLOCK_N keys of one key/value head, loops over the query heads of its group (GQA) and over query blocks,
recomputing P^T = exp2(K Q^T * c - L) and accumulating dV += P^T dO and dK += dS^T Q in registers;
`_bwd_dq` gives one program BLOCK_M queries and loops over key blocks for dQ += dS K. The same split into unmasked
and masked blocks applies, and causal blocks that see nothing are skipped.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import triton
import triton.language as tl

from fuselab.ops import tuning
from fuselab.ops.library import wrap_triton

LOG2E = 1.4426950408889634
FOLDER = Path(__file__).parent  # plans/<device key>.json: the plans `fuselab tune attention` chose (fuselab.ops.tuning)
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


# ---------------------------------------------------------------------------------------------- forward


@triton.jit
def _fwd_inner(
    acc,
    l_i,
    m_i,
    q,
    k_base,
    v_base,
    kv_offs_k,
    kv_offs_v,
    stride_kn,
    stride_vn,
    offs_m,
    offs_n,
    d_mask,
    lo,
    hi,
    NK,
    qk_scale,
    BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr,
    CAUSAL: tl.constexpr,
    EVEN_D: tl.constexpr,
    PREC: tl.constexpr,
):
    """Stream key/value blocks [lo, hi) past one query tile; MASKED blocks mask keys >= NK (and j > i if CAUSAL)."""
    for start_n in range(lo, hi, BLOCK_N):  # software-pipelined (num_stages)
        k_ptrs = k_base + tl.cast(start_n, tl.int64) * stride_kn + kv_offs_k
        v_ptrs = v_base + tl.cast(start_n, tl.int64) * stride_vn + kv_offs_v
        if MASKED:
            in_n = (start_n + offs_n) < NK
            kt = tl.load(k_ptrs, mask=in_n[None, :] & d_mask[:, None], other=0.0)
        elif EVEN_D:
            kt = tl.load(k_ptrs)
        else:
            kt = tl.load(k_ptrs, mask=d_mask[:, None], other=0.0)
        qk = tl.dot(q, kt, input_precision=PREC)
        if MASKED:
            keep = in_n[None, :]
            if CAUSAL:
                keep = keep & ((start_n + offs_n)[None, :] <= offs_m[:, None])
            qk = tl.where(keep, qk * qk_scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            qk = qk - m_new[:, None]
        else:
            m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            qk = qk * qk_scale - m_new[:, None]
        p = tl.math.exp2(qk)
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if MASKED:
            v = tl.load(v_ptrs, mask=in_n[:, None] & d_mask[None, :], other=0.0)
        elif EVEN_D:
            v = tl.load(v_ptrs)
        else:
            v = tl.load(v_ptrs, mask=d_mask[None, :], other=0.0)
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=PREC)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit(do_not_specialize=["NQ", "NK", "NUM_M", "GROUP"])  # lengths: no recompiles per N
def attention_fwd_kernel(
    Q,
    K,
    V,
    O,  # noqa: E741  (the papers' name)
    LSE,
    sqz,
    sqh,
    sqn,
    sqd,
    skz,
    skh,
    skn,
    skd,
    svz,
    svh,
    svn,
    svd,
    soz,
    soh,
    son,
    sod,
    HQ,
    GROUP,
    NQ,
    NK,
    NUM_M,
    qk_scale,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    PREC: tl.constexpr,
):
    """O[z, h] = softmax(Q[z, h] K[z, h // GROUP]^T * scale) V[z, h // GROUP]; LSE[z*HQ + h, i] natural log.

    Q, O: (Z, HQ, NQ, HEAD_DIM) by strides; K, V: (Z, HQ / GROUP, NK, HEAD_DIM); LSE: (Z * HQ, NQ) contiguous fp32.
    qk_scale = scale * log2(e). Grid: (NUM_M * Z * HQ,), NUM_M = cdiv(NQ, BLOCK_M).
    """
    EVEN_D: tl.constexpr = HEAD_DIM == D_PAD
    qk_scale = tl.cast(qk_scale, tl.float32)  # torch.compile passes a Python float as fp64: all math stays fp32
    pid = tl.program_id(0)
    bh = pid // NUM_M
    start_m = pid % NUM_M
    if CAUSAL:  # the longest rows first: a better tail for the last wave
        start_m = NUM_M - 1 - start_m
    z = bh // HQ
    h = bh % HQ
    hk = h // GROUP
    m0 = start_m * BLOCK_M
    q_base = Q + z.to(tl.int64) * sqz + h.to(tl.int64) * sqh + m0.to(tl.int64) * sqn
    k_base = K + z.to(tl.int64) * skz + hk.to(tl.int64) * skh
    v_base = V + z.to(tl.int64) * svz + hk.to(tl.int64) * svh
    o_base = O + z.to(tl.int64) * soz + h.to(tl.int64) * soh + m0.to(tl.int64) * son

    rows = tl.arange(0, BLOCK_M)
    offs_m = m0 + rows
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D_PAD)
    d_mask = offs_d < HEAD_DIM
    in_m = offs_m < NQ
    q = tl.load(q_base + rows[:, None] * sqn + offs_d[None, :] * sqd, mask=in_m[:, None] & d_mask[None, :], other=0.0)
    kv_offs_k = offs_n[None, :] * skn + offs_d[:, None] * skd  # K^T tile (D_PAD, BLOCK_N)
    kv_offs_v = offs_n[:, None] * svn + offs_d[None, :] * svd  # V tile (BLOCK_N, D_PAD)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D_PAD], dtype=tl.float32)
    nk_whole = (NK // BLOCK_N) * BLOCK_N
    if CAUSAL:
        full_hi = tl.minimum(((m0 + 1) // BLOCK_N) * BLOCK_N, nk_whole)  # blocks every row sees whole
        hi = tl.minimum(m0 + BLOCK_M, NK)
    else:
        full_hi = nk_whole
        hi = NK
    acc, l_i, m_i = _fwd_inner(
        acc, l_i, m_i, q, k_base, v_base, kv_offs_k, kv_offs_v, skn, svn, offs_m, offs_n, d_mask,
        0, full_hi, NK, qk_scale, BLOCK_N, False, CAUSAL, EVEN_D, PREC,
    )  # fmt: skip
    acc, l_i, m_i = _fwd_inner(
        acc, l_i, m_i, q, k_base, v_base, kv_offs_k, kv_offs_v, skn, svn, offs_m, offs_n, d_mask,
        full_hi, hi, NK, qk_scale, BLOCK_N, True, CAUSAL, EVEN_D, PREC,
    )  # fmt: skip
    out = acc / l_i[:, None]
    lse = (m_i + tl.math.log2(l_i)) * 0.6931471805599453
    tl.store(LSE + bh.to(tl.int64) * NQ + offs_m, lse, mask=in_m)
    o_ptrs = o_base + rows[:, None] * son + offs_d[None, :] * sod
    tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=in_m[:, None] & d_mask[None, :])


# ---------------------------------------------------------------------------------------------- backward


@triton.jit(do_not_specialize=["NQ", "NUM_M"])  # lengths: no recompiles per N
def attention_bwd_delta_kernel(
    O,  # noqa: E741  (the papers' name)
    DO,
    DELTA,
    soz,
    soh,
    son,
    sod,
    sdz,
    sdh,
    sdn,
    sdd,
    HQ,
    NQ,
    NUM_M,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    """DELTA[z*HQ + h, i] = sum_d O[z, h, i, d] * DO[z, h, i, d] in fp32. Grid: (NUM_M * Z * HQ,)."""
    pid = tl.program_id(0)
    bh = pid // NUM_M
    m0 = (pid % NUM_M) * BLOCK_M
    z = bh // HQ
    h = bh % HQ
    rows = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D_PAD)
    mask = ((m0 + rows) < NQ)[:, None] & (offs_d < HEAD_DIM)[None, :]
    o_ptrs = O + z.to(tl.int64) * soz + h.to(tl.int64) * soh + m0.to(tl.int64) * son
    do_ptrs = DO + z.to(tl.int64) * sdz + h.to(tl.int64) * sdh + m0.to(tl.int64) * sdn
    o = tl.load(o_ptrs + rows[:, None] * son + offs_d[None, :] * sod, mask=mask, other=0.0).to(tl.float32)
    do = tl.load(do_ptrs + rows[:, None] * sdn + offs_d[None, :] * sdd, mask=mask, other=0.0).to(tl.float32)
    tl.store(DELTA + bh.to(tl.int64) * NQ + m0 + rows, tl.sum(o * do, 1), mask=(m0 + rows) < NQ)


@triton.jit
def _dkdv_inner(
    dk,
    dv,
    k,
    v,
    q_base,
    do_base,
    lse_base,
    delta_base,
    q_offs,
    do_offs,
    sqn,
    sdn,
    offs_n,
    rows,
    d_mask,
    lo,
    hi,
    NQ,
    qk_scale,
    BLOCK_M: tl.constexpr,
    MASKED: tl.constexpr,
    CAUSAL: tl.constexpr,
    EVEN_D: tl.constexpr,
    PREC: tl.constexpr,
):
    """Accumulate one key block's dK (unscaled) and dV over query blocks [lo, hi)."""
    for start_m in range(lo, hi, BLOCK_M):  # software-pipelined (num_stages)
        q_ptrs = q_base + tl.cast(start_m, tl.int64) * sqn + q_offs
        do_ptrs = do_base + tl.cast(start_m, tl.int64) * sdn + do_offs
        offs_m = start_m + rows
        if MASKED:
            in_m = offs_m < NQ
            q = tl.load(q_ptrs, mask=in_m[:, None] & d_mask[None, :], other=0.0)
            do = tl.load(do_ptrs, mask=in_m[:, None] & d_mask[None, :], other=0.0)
            lse = tl.load(lse_base + offs_m, mask=in_m, other=0.0)
            delta = tl.load(delta_base + offs_m, mask=in_m, other=0.0)
        else:
            if EVEN_D:
                q = tl.load(q_ptrs)
                do = tl.load(do_ptrs)
            else:
                q = tl.load(q_ptrs, mask=d_mask[None, :], other=0.0)
                do = tl.load(do_ptrs, mask=d_mask[None, :], other=0.0)
            lse = tl.load(lse_base + offs_m)
            delta = tl.load(delta_base + offs_m)
        st = tl.dot(k, tl.trans(q), input_precision=PREC)  # (BLOCK_N, BLOCK_M) = S^T
        pt = tl.math.exp2(st * qk_scale - (lse * 1.4426950408889634)[None, :])
        if MASKED:
            keep = in_m[None, :]
            if CAUSAL:
                keep = keep & (offs_m[None, :] >= offs_n[:, None])
            pt = tl.where(keep, pt, 0.0)
        dv = tl.dot(pt.to(do.dtype), do, dv, input_precision=PREC)
        dpt = tl.dot(v, tl.trans(do), input_precision=PREC)
        dst = pt * (dpt - delta[None, :])
        dk = tl.dot(dst.to(q.dtype), q, dk, input_precision=PREC)
    return dk, dv


@triton.jit(do_not_specialize=["NQ", "NK", "NUM_N", "GROUP"])  # lengths: no recompiles per N
def attention_bwd_dkdv_kernel(
    Q,
    K,
    V,
    DO,
    LSE,
    DELTA,
    DK,
    DV,
    sqz,
    sqh,
    sqn,
    sqd,
    skz,
    skh,
    skn,
    skd,
    svz,
    svh,
    svn,
    svd,
    sdz,
    sdh,
    sdn,
    sdd,
    sdkz,
    sdkh,
    sdkn,
    sdkd,
    sdvz,
    sdvh,
    sdvn,
    sdvd,
    HKV,
    GROUP,
    NQ,
    NK,
    NUM_N,
    qk_scale,
    sm_scale,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    PREC: tl.constexpr,
):
    """dK, dV of BLOCK_N keys of head (z, hk), summed over its GROUP query heads. Grid: (NUM_N * Z * HKV,)."""
    EVEN_D: tl.constexpr = HEAD_DIM == D_PAD
    qk_scale, sm_scale = tl.cast(qk_scale, tl.float32), tl.cast(sm_scale, tl.float32)  # fp64 under torch.compile
    pid = tl.program_id(0)
    bh = pid // NUM_N
    n0 = (pid % NUM_N) * BLOCK_N
    z = bh // HKV
    hk = bh % HKV
    offs_n = n0 + tl.arange(0, BLOCK_N)
    rows = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D_PAD)
    d_mask = offs_d < HEAD_DIM
    in_n = offs_n < NK
    kv_mask = in_n[:, None] & d_mask[None, :]
    k_ptrs = K + z.to(tl.int64) * skz + hk.to(tl.int64) * skh + n0.to(tl.int64) * skn
    v_ptrs = V + z.to(tl.int64) * svz + hk.to(tl.int64) * svh + n0.to(tl.int64) * svn
    nrows = tl.arange(0, BLOCK_N)
    k = tl.load(k_ptrs + nrows[:, None] * skn + offs_d[None, :] * skd, mask=kv_mask, other=0.0)
    v = tl.load(v_ptrs + nrows[:, None] * svn + offs_d[None, :] * svd, mask=kv_mask, other=0.0)
    dk = tl.zeros([BLOCK_N, D_PAD], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, D_PAD], dtype=tl.float32)
    q_offs = rows[:, None] * sqn + offs_d[None, :] * sqd
    do_offs = rows[:, None] * sdn + offs_d[None, :] * sdd
    nq_whole = (NQ // BLOCK_M) * BLOCK_M
    if CAUSAL:
        lo = (n0 // BLOCK_M) * BLOCK_M  # the first query block that sees any of these keys
        full_lo = tl.minimum(tl.cdiv(n0 + BLOCK_N - 1, BLOCK_M) * BLOCK_M, nq_whole)  # blocks that see them all
        full_lo = tl.maximum(full_lo, lo)
    else:
        lo = 0
        full_lo = 0
    # a `while` (not `for`): the interpreter takes no runtime range bound (see _fwd_inner); the inner loops stay `for`
    g = tl.full((), 0, tl.int32)
    while g < GROUP:
        h = hk * GROUP + g
        q_base = Q + z.to(tl.int64) * sqz + h.to(tl.int64) * sqh
        do_base = DO + z.to(tl.int64) * sdz + h.to(tl.int64) * sdh
        lse_base = LSE + (z * HKV * GROUP + h).to(tl.int64) * NQ
        delta_base = DELTA + (z * HKV * GROUP + h).to(tl.int64) * NQ
        if CAUSAL:  # the diagonal's blocks, masked
            dk, dv = _dkdv_inner(
                dk, dv, k, v, q_base, do_base, lse_base, delta_base, q_offs, do_offs, sqn, sdn, offs_n, rows,
                d_mask, lo, full_lo, NQ, qk_scale, BLOCK_M, True, True, EVEN_D, PREC,
            )  # fmt: skip
        dk, dv = _dkdv_inner(
            dk, dv, k, v, q_base, do_base, lse_base, delta_base, q_offs, do_offs, sqn, sdn, offs_n, rows,
            d_mask, full_lo, nq_whole, NQ, qk_scale, BLOCK_M, False, False, EVEN_D, PREC,
        )  # fmt: skip
        dk, dv = _dkdv_inner(
            dk, dv, k, v, q_base, do_base, lse_base, delta_base, q_offs, do_offs, sqn, sdn, offs_n, rows,
            d_mask, tl.maximum(nq_whole, full_lo), NQ, NQ, qk_scale, BLOCK_M, True, CAUSAL, EVEN_D, PREC,
        )  # fmt: skip
        g += 1
    dk = dk * sm_scale
    dk_ptrs = DK + z.to(tl.int64) * sdkz + hk.to(tl.int64) * sdkh + n0.to(tl.int64) * sdkn
    dv_ptrs = DV + z.to(tl.int64) * sdvz + hk.to(tl.int64) * sdvh + n0.to(tl.int64) * sdvn
    tl.store(dk_ptrs + nrows[:, None] * sdkn + offs_d[None, :] * sdkd, dk.to(DK.dtype.element_ty), mask=kv_mask)
    tl.store(dv_ptrs + nrows[:, None] * sdvn + offs_d[None, :] * sdvd, dv.to(DV.dtype.element_ty), mask=kv_mask)


@triton.jit
def _dq_inner(
    dq,
    q,
    do,
    lse,
    delta,
    k_base,
    v_base,
    k_offs,
    v_offs,
    skn,
    svn,
    offs_m,
    offs_n,
    d_mask,
    lo,
    hi,
    NK,
    qk_scale,
    BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr,
    CAUSAL: tl.constexpr,
    EVEN_D: tl.constexpr,
    PREC: tl.constexpr,
):
    """Accumulate one query block's dQ (unscaled) over key blocks [lo, hi)."""
    for start_n in range(lo, hi, BLOCK_N):  # software-pipelined (num_stages)
        k_ptrs = k_base + tl.cast(start_n, tl.int64) * skn + k_offs
        v_ptrs = v_base + tl.cast(start_n, tl.int64) * svn + v_offs
        if MASKED:
            in_n = (start_n + offs_n) < NK
            k = tl.load(k_ptrs, mask=in_n[:, None] & d_mask[None, :], other=0.0)
            v = tl.load(v_ptrs, mask=in_n[:, None] & d_mask[None, :], other=0.0)
        elif EVEN_D:
            k = tl.load(k_ptrs)
            v = tl.load(v_ptrs)
        else:
            k = tl.load(k_ptrs, mask=d_mask[None, :], other=0.0)
            v = tl.load(v_ptrs, mask=d_mask[None, :], other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PREC)
        p = tl.math.exp2(s * qk_scale - lse[:, None])
        if MASKED:
            keep = in_n[None, :]
            if CAUSAL:
                keep = keep & ((start_n + offs_n)[None, :] <= offs_m[:, None])
            p = tl.where(keep, p, 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=PREC)
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=PREC)
    return dq


@triton.jit(do_not_specialize=["NQ", "NK", "NUM_M", "GROUP"])  # lengths: no recompiles per N
def attention_bwd_dq_kernel(
    Q,
    K,
    V,
    DO,
    LSE,
    DELTA,
    DQ,
    sqz,
    sqh,
    sqn,
    sqd,
    skz,
    skh,
    skn,
    skd,
    svz,
    svh,
    svn,
    svd,
    sdz,
    sdh,
    sdn,
    sdd,
    sdqz,
    sdqh,
    sdqn,
    sdqd,
    HQ,
    GROUP,
    NQ,
    NK,
    NUM_M,
    qk_scale,
    sm_scale,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    PREC: tl.constexpr,
):
    """dQ of BLOCK_M queries of head (z, h), looping over key blocks. Grid: (NUM_M * Z * HQ,)."""
    EVEN_D: tl.constexpr = HEAD_DIM == D_PAD
    qk_scale, sm_scale = tl.cast(qk_scale, tl.float32), tl.cast(sm_scale, tl.float32)  # fp64 under torch.compile
    pid = tl.program_id(0)
    bh = pid // NUM_M
    start_m = pid % NUM_M
    if CAUSAL:
        start_m = NUM_M - 1 - start_m
    z = bh // HQ
    h = bh % HQ
    hk = h // GROUP
    m0 = start_m * BLOCK_M
    rows = tl.arange(0, BLOCK_M)
    offs_m = m0 + rows
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D_PAD)
    d_mask = offs_d < HEAD_DIM
    in_m = offs_m < NQ
    mask = in_m[:, None] & d_mask[None, :]
    q_ptrs = Q + z.to(tl.int64) * sqz + h.to(tl.int64) * sqh + m0.to(tl.int64) * sqn
    do_ptrs = DO + z.to(tl.int64) * sdz + h.to(tl.int64) * sdh + m0.to(tl.int64) * sdn
    q = tl.load(q_ptrs + rows[:, None] * sqn + offs_d[None, :] * sqd, mask=mask, other=0.0)
    do = tl.load(do_ptrs + rows[:, None] * sdn + offs_d[None, :] * sdd, mask=mask, other=0.0)
    lse = tl.load(LSE + bh.to(tl.int64) * NQ + offs_m, mask=in_m, other=0.0) * 1.4426950408889634
    delta = tl.load(DELTA + bh.to(tl.int64) * NQ + offs_m, mask=in_m, other=0.0)
    k_base = K + z.to(tl.int64) * skz + hk.to(tl.int64) * skh
    v_base = V + z.to(tl.int64) * svz + hk.to(tl.int64) * svh
    k_offs = offs_n[:, None] * skn + offs_d[None, :] * skd
    v_offs = offs_n[:, None] * svn + offs_d[None, :] * svd
    dq = tl.zeros([BLOCK_M, D_PAD], dtype=tl.float32)
    nk_whole = (NK // BLOCK_N) * BLOCK_N
    if CAUSAL:
        full_hi = tl.minimum(((m0 + 1) // BLOCK_N) * BLOCK_N, nk_whole)
        hi = tl.minimum(m0 + BLOCK_M, NK)
    else:
        full_hi = nk_whole
        hi = NK
    dq = _dq_inner(
        dq, q, do, lse, delta, k_base, v_base, k_offs, v_offs, skn, svn, offs_m, offs_n, d_mask,
        0, full_hi, NK, qk_scale, BLOCK_N, False, CAUSAL, EVEN_D, PREC,
    )  # fmt: skip
    dq = _dq_inner(
        dq, q, do, lse, delta, k_base, v_base, k_offs, v_offs, skn, svn, offs_m, offs_n, d_mask,
        full_hi, hi, NK, qk_scale, BLOCK_N, True, CAUSAL, EVEN_D, PREC,
    )  # fmt: skip
    dq = dq * sm_scale
    dq_ptrs = DQ + z.to(tl.int64) * sdqz + h.to(tl.int64) * sdqh + m0.to(tl.int64) * sdqn
    tl.store(dq_ptrs + rows[:, None] * sdqn + offs_d[None, :] * sdqd, dq.to(DQ.dtype.element_ty), mask=mask)


TRITON_KERNELS = (attention_fwd_kernel, attention_bwd_delta_kernel, attention_bwd_dkdv_kernel, attention_bwd_dq_kernel)


# ---------------------------------------------------------------------------------------------- plans


@dataclass(frozen=True)
class Plan:
    """One kernel's launch: BLOCK_M queries x BLOCK_N keys per tile, warps, pipeline stages."""

    block_m: int
    block_n: int
    warps: int
    stages: int


KERNELS = ("fwd", "dkdv", "dq")


def d_pad(d: int) -> int:
    """The head dim padded to a power of two, at least 16 (tl.dot's smallest)."""
    return max(16, triton.next_power_of_2(d))


def plan_key(kernel: str, d: int, dtype: torch.dtype, causal: bool) -> str:
    """The plan table's key: kernel, padded head dim, element size, causal."""
    return f"{kernel}|d{d_pad(d)}|{dtype.itemsize * 8}bit|{'causal' if causal else 'full'}"


def rule_plan(kernel: str, d: int, dtype: torch.dtype, causal: bool) -> Plan:
    """The plan by rule, from the bytes one tile row holds (padded d x element size).

    Forward: 128 queries x 64 keys at rows up to 256 bytes (d <= 128 in 16 bits), 8 warps past 128 bytes;
    wider rows halve the tile so K/V stages fit in shared memory. dK/dV: 64 queries x 128 keys (the accumulators
    live with the keys); dQ: 128 queries x 64 keys; both halve past 256-byte rows. Under the interpreter: 16 x 16.
    """
    if INTERPRET:
        return Plan(16, 16, 1, 1)
    row = d_pad(d) * dtype.itemsize
    if kernel == "fwd":
        if row <= 128:
            return Plan(128, 64, 4, 3)
        if row <= 256:
            return Plan(128, 64, 8, 3)
        return Plan(64, 32, 4, 2) if row <= 512 else Plan(32, 32, 4, 1)
    if kernel == "dkdv":
        if row <= 128:
            return Plan(64, 128, 8, 3)
        if row <= 256:
            return Plan(32, 128, 8, 2)
        return Plan(32, 64, 4, 1) if row <= 512 else Plan(16, 32, 4, 1)
    if row <= 128:  # dq
        return Plan(128, 64, 8, 3)
    if row <= 256:
        return Plan(128, 32, 8, 2)
    return Plan(64, 32, 4, 1) if row <= 512 else Plan(32, 16, 4, 1)


@functools.cache
def _device_info(index: int) -> tuple[str, int]:
    """(plan table key, SM count) of CUDA device `index`."""
    return tuning.device_key(index), torch.cuda.get_device_properties(index).multi_processor_count


FORCED: dict[str, Plan] = {}  # kernel -> plan, set by `forced_plans` (the tuner, tests)


@contextlib.contextmanager
def forced_plans(plans: dict[str, Plan]) -> Iterator[None]:
    """Within the block, launch the kernels named in `plans` ("fwd", "dkdv", "dq") with those plans, as given."""
    saved = dict(FORCED)
    FORCED.update(plans)
    try:
        yield
    finally:
        FORCED.clear()
        FORCED.update(saved)


def choose_plan(
    kernel: str, d: int, dtype: torch.dtype, causal: bool, device: torch.device, rows: int, heads: int
) -> Plan:
    """The tuned plan for this GPU if its table has one, else the rule's. Then, while the grid (cdiv(rows, block) x
    heads programs, the block along `rows`: keys for dkdv, queries otherwise) would not give every SM one program,
    that block is halved, down to 32."""
    if kernel in FORCED:
        return FORCED[kernel]
    plan = rule_plan(kernel, d, dtype, causal)
    if device.type != "cuda" or INTERPRET:
        return plan
    key, sms = _device_info(device.index if device.index is not None else torch.cuda.current_device())
    tuned = tuning.load_table(FOLDER, key).get(plan_key(kernel, d, dtype, causal))
    plan = Plan(**tuned) if tuned else plan
    major = plan.block_n if kernel == "dkdv" else plan.block_m
    while major > 32 and triton.cdiv(rows, major) * heads < sms:
        major //= 2
    if kernel == "dkdv":
        return Plan(min(plan.block_m, major), major, plan.warps, plan.stages)
    return Plan(major, min(plan.block_n, major), plan.warps, plan.stages)


# ---------------------------------------------------------------------------------------------- launchers


def _launch(kernel: triton.JITFunction, grid: tuple[int], *args: object, plan: Plan, **constexprs: object) -> None:
    """Launch through fuselab.ops.library.wrap_triton, so torch.compile sees the kernel (a plain call in eager)."""
    wrap_triton(kernel)[grid](*args, **constexprs, num_warps=plan.warps, num_stages=plan.stages)


def as_4d(t: torch.Tensor) -> torch.Tensor:
    """(B, N, d) -> (B, 1, N, d) and (..., H, N, d) -> (Z, H, N, d), views where the strides allow."""
    if t.dim() == 3:
        return t.unsqueeze(1)
    return t if t.dim() == 4 else t.reshape(-1, *t.shape[-3:])


def _precision(dtype: torch.dtype) -> str:
    """fp32 inputs are multiplied in full fp32 ("ieee"), not TF32; the setting is moot for 16-bit inputs."""
    return "ieee" if dtype == torch.float32 else "tf32"


def forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """O (q's shape, contiguous) and L (q's shape without d, fp32, natural log). Inputs checked by the caller."""
    q4, k4, v4 = as_4d(q), as_4d(k), as_4d(v)
    z, hq, nq, d = q4.shape
    hkv, nk = k4.shape[1], k4.shape[2]
    o = torch.empty((z, hq, nq, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((z, hq, nq), dtype=torch.float32, device=q.device)
    if o.numel() > 0:
        plan = choose_plan("fwd", d, q.dtype, causal, q.device, nq, z * hq)
        num_m = triton.cdiv(nq, plan.block_m)
        _launch(
            attention_fwd_kernel, (num_m * z * hq,), q4, k4, v4, o, lse,
            *q4.stride(), *k4.stride(), *v4.stride(), *o.stride(), hq, hq // hkv, nq, nk, num_m, scale * LOG2E,
            plan=plan, HEAD_DIM=d, D_PAD=d_pad(d), BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, CAUSAL=causal,
            PREC=_precision(q.dtype),
        )  # fmt: skip
    return o.reshape(q.shape), lse.reshape(q.shape[:-1])


def backward(
    do: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    causal: bool,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dQ, dK, dV (contiguous, shapes and dtypes of q, k, v); do may have any strides (0 too)."""
    do = do.to(q.dtype)
    if do.stride(-1) != 1 or 0 in do.stride():
        # A broadcast gradient (o.sum().backward() hands in stride 0 everywhere) would be read element by element
        # three times; one contiguous copy (N x d) costs far less. Other strides are read in place.
        do = do.contiguous()
    q4, k4, v4, o4, do4 = as_4d(q), as_4d(k), as_4d(v), as_4d(o), as_4d(do)
    z, hq, nq, d = q4.shape
    hkv, nk = k4.shape[1], k4.shape[2]
    dq = torch.empty((z, hq, nq, d), dtype=q.dtype, device=q.device)
    dk = torch.empty((z, hkv, nk, d), dtype=k.dtype, device=q.device)
    dv = torch.empty((z, hkv, nk, d), dtype=v.dtype, device=q.device)
    if dk.numel() > 0 and nq == 0:
        dk.zero_()
        dv.zero_()
    if dq.numel() > 0:
        delta = torch.empty((z, hq, nq), dtype=torch.float32, device=q.device)
        lse4 = lse.reshape(z, hq, nq)
        block = 16 if INTERPRET else 64
        num = triton.cdiv(nq, block)
        _launch(
            attention_bwd_delta_kernel, (num * z * hq,), o4, do4, delta, *o4.stride(), *do4.stride(), hq, nq, num,
            plan=Plan(block, block, 1 if INTERPRET else 4, 1), HEAD_DIM=d, D_PAD=d_pad(d), BLOCK_M=block,
        )  # fmt: skip
        prec = _precision(q.dtype)
        plan = choose_plan("dkdv", d, q.dtype, causal, q.device, nk, z * hkv)
        num = triton.cdiv(nk, plan.block_n)
        _launch(
            attention_bwd_dkdv_kernel, (num * z * hkv,), q4, k4, v4, do4, lse4, delta, dk, dv,
            *q4.stride(), *k4.stride(), *v4.stride(), *do4.stride(), *dk.stride(), *dv.stride(),
            hkv, hq // hkv, nq, nk, num, scale * LOG2E, scale,
            plan=plan, HEAD_DIM=d, D_PAD=d_pad(d), BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, CAUSAL=causal,
            PREC=prec,
        )  # fmt: skip
        plan = choose_plan("dq", d, q.dtype, causal, q.device, nq, z * hq)
        num = triton.cdiv(nq, plan.block_m)
        _launch(
            attention_bwd_dq_kernel, (num * z * hq,), q4, k4, v4, do4, lse4, delta, dq,
            *q4.stride(), *k4.stride(), *v4.stride(), *do4.stride(), *dq.stride(),
            hq, hq // hkv, nq, nk, num, scale * LOG2E, scale,
            plan=plan, HEAD_DIM=d, D_PAD=d_pad(d), BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, CAUSAL=causal,
            PREC=prec,
        )  # fmt: skip
    return dq.reshape(q.shape), dk.reshape(k.shape), dv.reshape(v.shape)
