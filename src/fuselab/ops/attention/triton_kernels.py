"""FlashAttention-2 forward and backward as Triton kernels (imported lazily: only this module needs Triton).

Layout: every tensor is addressed as (Z, H, N, D) through its four strides, so non-contiguous q, k, v and output
gradients are read in place; a gradient with a stride 0 (`o.sum().backward()`) or a non-unit last stride is copied
to contiguous first. The head dim is held in one or two column chunks, each a power of two >= 16 (`d_chunks`: 80 as
64 + 16, 96 as 64 + 32, so the tensor cores do not multiply the zeros of a pad to 128), with masks where a chunk
passes d. Each program's (batch, head) base offset and row-block offset are 64-bit; offsets inside a tile are 32-bit.

Forward (one program per BLOCK_M queries of one head): the query tile stays in registers, key/value tiles of BLOCK_N
stream past; online softmax in base 2 with log2(e) folded into the scale; per row it writes O and the logsumexp
L = (m + log2 l) * ln 2 (natural log, float32). The key range is split in two loops: whole key blocks that need no
mask at all, then the few that do (the causal diagonal, and the ragged last block); key blocks wholly above the
diagonal are never visited.

Backward (deterministic, no atomics): `_bwd_delta` computes delta = rowsum(dO * O); `_bwd_dkdv` gives one program
BLOCK_N keys of one key/value head (causal: only keys some query sees; the rest are zero-filled, not launched),
loops over the query heads of its group (GQA) and over query blocks, recomputing P^T = exp2(K Q^T * c - L) and
accumulating dV += P^T dO and dK += dS^T Q in registers; `_bwd_dq` gives one program BLOCK_M queries and loops over
key blocks for dQ += dS K. The same split into unmasked and masked blocks applies, and causal blocks that see
nothing are skipped. Where the dK/dV grid cannot fill the SMs (few keys), each key block's query loop is split into
shares over a second grid dimension (`query_splits`), each writing unscaled fp32 partial dK and dV that the launcher
sums in a fixed order. The math of one pair of tiles is written once (`_softmax_step`, `_dkdv_step`, `_dq_step`) for
the pointer and the TMA kernels alike. Where `stores_scores` says so (tensors TMA can address), the dK/dV kernel also
writes each dS^T tile it makes (16-bit, a workspace of heads x Nk x Nq) and `attention_bwd_dq_ds_kernel` reads them
for dQ += dS K, one product a tile pair where the dQ kernel makes three; the same fixed order, so still deterministic.

TMA: on Hopper and later, 16-bit tensors whose strides TMA can address (`tma_ready`) are read and written by tensor
descriptors (the `*_tma_kernel`s: the copy engine moves each tile, zero-filling past the tensor's edges, so loads need
no masks and no address tile takes registers); other inputs (fp32, unaligned views, d 256, the interpreter unless a
test forces it) take the pointer kernels. Both give the same results bitwise.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from fuselab.ops import launcher, tuning
from fuselab.ops.library import wrap_triton

LOG2E = 1.4426950408889634
FOLDER = Path(__file__).parent  # plans/<device key>.json: the plans `fuselab tune attention` chose (fuselab.ops.tuning)
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


# ---------------------------------------------------------------------------------------------- tiles


@triton.jit
def _tile(ptrs, rows_ok, cols_ok, MASK_ROWS: tl.constexpr, MASK_COLS: tl.constexpr):
    """Load a 2-D tile, zeros where masked: rows by rows_ok (dim 0) if MASK_ROWS, columns by cols_ok if MASK_COLS."""
    if MASK_ROWS:
        if MASK_COLS:
            x = tl.load(ptrs, mask=rows_ok[:, None] & cols_ok[None, :], other=0.0)
        else:
            x = tl.load(ptrs, mask=rows_ok[:, None], other=0.0)
    elif MASK_COLS:
        x = tl.load(ptrs, mask=cols_ok[None, :], other=0.0)
    else:
        x = tl.load(ptrs)
    return x


@triton.jit
def _aligned(sz, sh, sn, ALIGN: tl.constexpr):
    """A tensor's batch, head and row strides (elements), known to Triton as multiples of ALIGN, which the launcher
    checked they are (`row_align`). Triton assumes divisibility only of integer arguments it sees divisible by 16, and
    `tl.multiple_of` on an argument is lost; so without this, heads of 40 or 200 columns (row strides 8 mod 16) were
    read 2-4 bytes at a time (sm_90 PTX, scripts/attention_offline_audit.py)."""
    return sz // ALIGN * ALIGN, sh // ALIGN * ALIGN, sn // ALIGN * ALIGN


@triton.jit
def _program(NUM, H, ORDER_HEADS, LONGEST_FIRST: tl.constexpr, ACROSS_HEADS: tl.constexpr):
    """This program's (bh, z, h, block): program_id = bh * NUM + block over Z x H heads of NUM row blocks each, or
    with ACROSS_HEADS (causal blocks, whose work falls block by block) block by block across groups of ORDER_HEADS
    heads (`order_heads`), one group after another, so that the longest block of every head of a group starts before
    a shorter one of any (the last wave's programs are short, not one head's longest). The last group takes the
    heads left over too (ORDER_HEADS to 2 ORDER_HEADS - 1 of them): a smaller one would start its longest blocks
    last. LONGEST_FIRST numbers the blocks from the last (causal query blocks, whose last is the longest)."""
    pid = tl.program_id(0)
    if ACROSS_HEADS:
        heads = tl.num_programs(0) // NUM
        last = tl.maximum(heads // ORDER_HEADS, 1) - 1  # the last group's index
        first = tl.minimum(pid // (ORDER_HEADS * NUM), last) * ORDER_HEADS  # the group's first head
        size = tl.where(first == last * ORDER_HEADS, heads - first, ORDER_HEADS)
        rank = pid - first * NUM
        bh = first + rank % size
        block = rank // size
    else:
        bh = pid // NUM
        block = pid % NUM
    if LONGEST_FIRST:
        block = NUM - 1 - block
    return bh, bh // H, bh % H, block


# ---------------------------------------------------------------------------------------------- forward


@triton.jit
def _key_ranges(m0, NK, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """(full_hi, hi) for the query block at m0: key blocks [0, full_hi) need no mask, [full_hi, hi) do (the causal
    diagonal, the ragged last block); causal keys past hi are seen by none of the block's queries."""
    nk_whole = (NK // BLOCK_N) * BLOCK_N
    if CAUSAL:
        full_hi = tl.minimum(((m0 + 1) // BLOCK_N) * BLOCK_N, nk_whole)  # blocks every row sees whole
        hi = tl.minimum(m0 + BLOCK_M, NK)
    else:
        full_hi = nk_whole
        hi = NK
    return full_hi, hi


@triton.jit
def _softmax_step(qk, m_i, l_i, offs_m, offs_k, NK, qk_scale, MASKED: tl.constexpr, CAUSAL: tl.constexpr):
    """One key block's online-softmax update of the raw scores qk (BLOCK_M, BLOCK_N) of keys offs_k: (P in fp32,
    alpha (the factor the accumulator is rescaled by), the new row max m, the new row sum l), all base 2. MASKED:
    keys >= NK (and, CAUSAL, keys after the query) get no weight."""
    if MASKED:
        keep = (offs_k < NK)[None, :]
        if CAUSAL:
            keep = keep & (offs_k[None, :] <= offs_m[:, None])
        qk = tl.where(keep, qk * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        qk = qk - m_new[:, None]
    else:
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        qk = qk * qk_scale - m_new[:, None]
    p = tl.math.exp2(qk)
    alpha = tl.math.exp2(m_i - m_new)
    return p, alpha, m_new, l_i * alpha + tl.sum(p, 1)


@triton.jit
def _fwd_inner(
    acc_a,
    acc_b,
    l_i,
    m_i,
    q_a,
    q_b,
    k_base,
    v_base,
    kt_offs_a,
    kt_offs_b,
    v_offs_a,
    v_offs_b,
    stride_kn,
    stride_vn,
    offs_m,
    offs_n,
    ok_a,
    ok_b,
    lo,
    hi,
    NK,
    qk_scale,
    BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr,
    CAUSAL: tl.constexpr,
    MASK_A: tl.constexpr,
    SPLIT: tl.constexpr,
    MASK_B: tl.constexpr,
    PREC: tl.constexpr,
):
    """Stream key/value blocks [lo, hi) past one query tile; MASKED blocks mask keys >= NK (and j > i if CAUSAL).
    The head dim is one chunk (a) or, if SPLIT, two (a then b): each product over d is a sum of the chunks'."""
    for start_n in range(lo, hi, BLOCK_N):  # software-pipelined (num_stages)
        k_ptrs = k_base + tl.cast(start_n, tl.int64) * stride_kn
        v_ptrs = v_base + tl.cast(start_n, tl.int64) * stride_vn
        in_n = (start_n + offs_n) < NK
        qk = tl.dot(q_a, _tile(k_ptrs + kt_offs_a, ok_a, in_n, MASK_A, MASKED), input_precision=PREC)
        if SPLIT:
            qk = tl.dot(q_b, _tile(k_ptrs + kt_offs_b, ok_b, in_n, MASK_B, MASKED), qk, input_precision=PREC)
        p, alpha, m_new, l_i = _softmax_step(qk, m_i, l_i, offs_m, start_n + offs_n, NK, qk_scale, MASKED, CAUSAL)
        v_a = _tile(v_ptrs + v_offs_a, in_n, ok_a, MASKED, MASK_A)
        p = p.to(v_a.dtype)
        acc_a = tl.dot(p, v_a, acc_a * alpha[:, None], input_precision=PREC)
        if SPLIT:
            v_b = _tile(v_ptrs + v_offs_b, in_n, ok_b, MASKED, MASK_B)
            acc_b = tl.dot(p, v_b, acc_b * alpha[:, None], input_precision=PREC)
        m_i = m_new
    return acc_a, acc_b, l_i, m_i


@triton.jit(do_not_specialize=["NQ", "NK", "NUM_M", "GROUP", "ORDER_HEADS"])  # lengths: no recompiles per N
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
    ORDER_HEADS,
    qk_scale,
    HEAD_DIM: tl.constexpr,
    ALIGN: tl.constexpr,
    DA: tl.constexpr,
    DB: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    PREC: tl.constexpr,
):
    """O[z, h] = softmax(Q[z, h] K[z, h // GROUP]^T * scale) V[z, h // GROUP]; LSE[z*HQ + h, i] natural log.

    Q, O: (Z, HQ, NQ, HEAD_DIM) by strides; K, V: (Z, HQ / GROUP, NK, HEAD_DIM); LSE: (Z * HQ, NQ) contiguous fp32.
    qk_scale = scale * log2(e). The head dim in chunks of DA and DB columns (DB = 0: one chunk; see d_chunks).
    Grid: (NUM_M * Z * HQ,), NUM_M = cdiv(NQ, BLOCK_M).
    """
    SPLIT: tl.constexpr = DB > 0
    MASK_A: tl.constexpr = HEAD_DIM < DA
    MASK_B: tl.constexpr = HEAD_DIM < DA + DB
    qk_scale = tl.cast(qk_scale, tl.float32)  # torch.compile passes a Python float as fp64: all math stays fp32
    sqz, sqh, sqn = _aligned(sqz, sqh, sqn, ALIGN)
    skz, skh, skn = _aligned(skz, skh, skn, ALIGN)
    svz, svh, svn = _aligned(svz, svh, svn, ALIGN)
    soz, soh, son = _aligned(soz, soh, son, ALIGN)
    bh, z, h, block = _program(NUM_M, HQ, ORDER_HEADS, CAUSAL, CAUSAL)
    hk = h // GROUP
    m0 = block * BLOCK_M
    q_base = Q + z.to(tl.int64) * sqz + h.to(tl.int64) * sqh + m0.to(tl.int64) * sqn
    k_base = K + z.to(tl.int64) * skz + hk.to(tl.int64) * skh
    v_base = V + z.to(tl.int64) * svz + hk.to(tl.int64) * svh
    o_base = O + z.to(tl.int64) * soz + h.to(tl.int64) * soh + m0.to(tl.int64) * son

    rows = tl.arange(0, BLOCK_M)
    offs_m = m0 + rows
    offs_n = tl.arange(0, BLOCK_N)
    in_m = offs_m < NQ
    offs_a = tl.arange(0, DA)
    ok_a = offs_a < HEAD_DIM
    q_a = _tile(q_base + rows[:, None] * sqn + offs_a[None, :] * sqd, in_m, ok_a, True, MASK_A)
    kt_offs_a = offs_n[None, :] * skn + offs_a[:, None] * skd  # K^T tile (DA, BLOCK_N)
    v_offs_a = offs_n[:, None] * svn + offs_a[None, :] * svd  # V tile (BLOCK_N, DA)
    acc_a = tl.zeros([BLOCK_M, DA], dtype=tl.float32)
    if SPLIT:
        offs_b = DA + tl.arange(0, DB)
        ok_b = offs_b < HEAD_DIM
        q_b = _tile(q_base + rows[:, None] * sqn + offs_b[None, :] * sqd, in_m, ok_b, True, MASK_B)
        kt_offs_b = offs_n[None, :] * skn + offs_b[:, None] * skd
        v_offs_b = offs_n[:, None] * svn + offs_b[None, :] * svd
        acc_b = tl.zeros([BLOCK_M, DB], dtype=tl.float32)
    else:  # placeholders, never read
        ok_b, q_b, kt_offs_b, v_offs_b, acc_b = ok_a, q_a, kt_offs_a, v_offs_a, acc_a

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    full_hi, hi = _key_ranges(m0, NK, BLOCK_M, BLOCK_N, CAUSAL)
    acc_a, acc_b, l_i, m_i = _fwd_inner(
        acc_a, acc_b, l_i, m_i, q_a, q_b, k_base, v_base, kt_offs_a, kt_offs_b, v_offs_a, v_offs_b, skn, svn,
        offs_m, offs_n, ok_a, ok_b, 0, full_hi, NK, qk_scale, BLOCK_N, False, CAUSAL, MASK_A, SPLIT, MASK_B, PREC,
    )  # fmt: skip
    acc_a, acc_b, l_i, m_i = _fwd_inner(
        acc_a, acc_b, l_i, m_i, q_a, q_b, k_base, v_base, kt_offs_a, kt_offs_b, v_offs_a, v_offs_b, skn, svn,
        offs_m, offs_n, ok_a, ok_b, full_hi, hi, NK, qk_scale, BLOCK_N, True, CAUSAL, MASK_A, SPLIT, MASK_B, PREC,
    )  # fmt: skip
    lse = (m_i + tl.math.log2(l_i)) * 0.6931471805599453
    tl.store(LSE + bh.to(tl.int64) * NQ + offs_m, lse, mask=in_m)
    o_ptrs = o_base + rows[:, None] * son
    out = (acc_a / l_i[:, None]).to(O.dtype.element_ty)
    tl.store(o_ptrs + offs_a[None, :] * sod, out, mask=in_m[:, None] & ok_a[None, :])
    if SPLIT:
        out = (acc_b / l_i[:, None]).to(O.dtype.element_ty)
        tl.store(o_ptrs + offs_b[None, :] * sod, out, mask=in_m[:, None] & ok_b[None, :])


@triton.jit
def _fwd_inner_tma(
    acc_a,
    acc_b,
    l_i,
    m_i,
    q_a,
    q_b,
    k_da,
    k_db,
    v_da,
    v_db,
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
    PREC: tl.constexpr,
):
    """`_fwd_inner` with the key and value tiles read through the descriptors k_da, k_db, v_da, v_db (chunk a at column
    0, chunk b at column DA; DB = 0: one chunk); rows past NK arrive as zeros, so only the scores are masked."""
    for start_n in range(lo, hi, BLOCK_N):  # software-pipelined (num_stages)
        kt = tl.trans(k_da.load([z, hk, start_n, 0]).reshape(BLOCK_N, DA))
        qk = tl.dot(q_a, kt, input_precision=PREC)
        if DB > 0:
            kt = tl.trans(k_db.load([z, hk, start_n, DA]).reshape(BLOCK_N, DB))
            qk = tl.dot(q_b, kt, qk, input_precision=PREC)
        p, alpha, m_new, l_i = _softmax_step(qk, m_i, l_i, offs_m, start_n + offs_n, NK, qk_scale, MASKED, CAUSAL)
        v = v_da.load([z, hk, start_n, 0]).reshape(BLOCK_N, DA)
        p = p.to(v.dtype)
        acc_a = tl.dot(p, v, acc_a * alpha[:, None], input_precision=PREC)
        if DB > 0:
            v = v_db.load([z, hk, start_n, DA]).reshape(BLOCK_N, DB)
            acc_b = tl.dot(p, v, acc_b * alpha[:, None], input_precision=PREC)
        m_i = m_new
    return acc_a, acc_b, l_i, m_i


@triton.jit(do_not_specialize=["NQ", "NK", "NUM_M", "GROUP", "ORDER_HEADS"])  # lengths: no recompiles per N
def attention_fwd_tma_kernel(
    q_da,
    q_db,
    k_da,
    k_db,
    v_da,
    v_db,
    o_da,
    o_db,
    LSE,
    HQ,
    GROUP,
    NQ,
    NK,
    NUM_M,
    ORDER_HEADS,
    qk_scale,
    DA: tl.constexpr,
    DB: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    PREC: tl.constexpr,
):
    """`attention_fwd_kernel` through tensor descriptors: q_da, q_db, k_da, ... over the (Z, H, N, d) tensors, blocks
    [1, 1, BLOCK_M or BLOCK_N, DA or DB] (the b descriptors unused when DB = 0). Same grid, outputs and math."""
    qk_scale = tl.cast(qk_scale, tl.float32)
    bh, z, h, block = _program(NUM_M, HQ, ORDER_HEADS, CAUSAL, CAUSAL)
    hk = h // GROUP
    m0 = block * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    q_a = q_da.load([z, h, m0, 0]).reshape(BLOCK_M, DA)
    acc_a = tl.zeros([BLOCK_M, DA], dtype=tl.float32)
    if DB > 0:
        q_b = q_db.load([z, h, m0, DA]).reshape(BLOCK_M, DB)
        acc_b = tl.zeros([BLOCK_M, DB], dtype=tl.float32)
    else:  # placeholders, never read
        q_b, acc_b = q_a, acc_a
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    full_hi, hi = _key_ranges(m0, NK, BLOCK_M, BLOCK_N, CAUSAL)
    acc_a, acc_b, l_i, m_i = _fwd_inner_tma(
        acc_a, acc_b, l_i, m_i, q_a, q_b, k_da, k_db, v_da, v_db, z, hk, offs_m, offs_n, 0, full_hi, NK, qk_scale,
        BLOCK_N, DA, DB, False, CAUSAL, PREC,
    )  # fmt: skip
    acc_a, acc_b, l_i, m_i = _fwd_inner_tma(
        acc_a, acc_b, l_i, m_i, q_a, q_b, k_da, k_db, v_da, v_db, z, hk, offs_m, offs_n, full_hi, hi, NK, qk_scale,
        BLOCK_N, DA, DB, True, CAUSAL, PREC,
    )  # fmt: skip
    lse = (m_i + tl.math.log2(l_i)) * 0.6931471805599453
    tl.store(LSE + bh.to(tl.int64) * NQ + offs_m, lse, mask=offs_m < NQ)
    o_da.store([z, h, m0, 0], (acc_a / l_i[:, None]).to(o_da.dtype).reshape(1, 1, BLOCK_M, DA))
    if DB > 0:
        o_db.store([z, h, m0, DA], (acc_b / l_i[:, None]).to(o_db.dtype).reshape(1, 1, BLOCK_M, DB))


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
    ALIGN: tl.constexpr,
    DA: tl.constexpr,
    DB: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    """DELTA[z*HQ + h, i] = sum_d O[z, h, i, d] * DO[z, h, i, d] in fp32 (`_block_delta`). Grid: (NUM_M * Z * HQ,)."""
    soz, soh, son = _aligned(soz, soh, son, ALIGN)
    sdz, sdh, sdn = _aligned(sdz, sdh, sdn, ALIGN)
    bh, z, h, block = _program(NUM_M, HQ, 1, False, False)
    _block_delta(
        O, DO, DELTA, z, h, bh, block * BLOCK_M, soz, soh, son, sod, sdz, sdh, sdn, sdd, NQ, HEAD_DIM, DA, DB, BLOCK_M
    )  # fmt: skip


@triton.jit
def _block_delta(
    O,  # noqa: E741  (the papers' name)
    DO,
    DELTA,
    z,
    h,
    bh,
    m0,
    soz,
    soh,
    son,
    sod,
    sdz,
    sdh,
    sdn,
    sdd,
    NQ,
    HEAD_DIM: tl.constexpr,
    DA: tl.constexpr,
    DB: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    """delta = rowsum(O * dO) of the query block at m0 of head (z, h), in fp32, from O and dO read by pointers (any
    strides) in the head dim's chunks DA, DB; stored to DELTA[bh, m0:] for the dK/dV kernel, and returned. The delta
    kernel and the dQ kernels (`delta_in_dq`) alike sum here, by pointers, on BLOCK_M rows: the same layout and so the
    same bits wherever delta is made, as the TMA and pointer paths must give the same gradients (the TMA dQ kernel's
    dO tile, summed as it came, made its delta and so dQ and dK differ in the last bit)."""
    rows = tl.arange(0, BLOCK_M)
    in_m = (m0 + rows) < NQ
    o_ptrs = O + z.to(tl.int64) * soz + h.to(tl.int64) * soh + m0.to(tl.int64) * son + rows[:, None] * son
    do_ptrs = DO + z.to(tl.int64) * sdz + h.to(tl.int64) * sdh + m0.to(tl.int64) * sdn + rows[:, None] * sdn
    offs_a = tl.arange(0, DA)
    o_a = _tile(o_ptrs + offs_a[None, :] * sod, in_m, offs_a < HEAD_DIM, True, HEAD_DIM < DA)
    do_a = _tile(do_ptrs + offs_a[None, :] * sdd, in_m, offs_a < HEAD_DIM, True, HEAD_DIM < DA)
    delta = tl.sum(o_a.to(tl.float32) * do_a.to(tl.float32), 1)
    if DB > 0:
        offs_b = DA + tl.arange(0, DB)
        o_b = _tile(o_ptrs + offs_b[None, :] * sod, in_m, offs_b < HEAD_DIM, True, HEAD_DIM < DA + DB)
        do_b = _tile(do_ptrs + offs_b[None, :] * sdd, in_m, offs_b < HEAD_DIM, True, HEAD_DIM < DA + DB)
        delta += tl.sum(o_b.to(tl.float32) * do_b.to(tl.float32), 1)
    tl.store(DELTA + bh.to(tl.int64) * NQ + m0 + rows, delta, mask=in_m)
    return delta


@triton.jit
def _dkdv_step(
    dk_a,
    dk_b,
    dv_a,
    dv_b,
    k_a,
    k_b,
    v_a,
    v_b,
    q_a,
    q_b,
    do_a,
    do_b,
    lse,
    delta,
    offs_m,
    offs_n,
    in_m,
    qk_scale,
    MASKED: tl.constexpr,
    CAUSAL: tl.constexpr,
    SPLIT: tl.constexpr,
    PREC: tl.constexpr,
):
    """One query block's share of one key block's dK (unscaled) and dV, in the transposed frame (keys x queries):
    S^T = K Q^T, P^T = exp2(S^T c - L log2 e), dV += P^T dO, dP^T = V dO^T, dS^T = P^T (dP^T - delta), dK += dS^T Q.
    MASKED: queries outside in_m (and, CAUSAL, those before the key) get no weight. Returns dS^T too (in q's dtype)."""
    st = tl.dot(k_a, tl.trans(q_a), input_precision=PREC)  # (BLOCK_N, BLOCK_M) = S^T
    if SPLIT:
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
    return dk_a, dk_b, dv_a, dv_b, dst


@triton.jit
def _query_ranges(n0, NQ, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, QSPLIT: tl.constexpr):
    """The key block at n0's three query ranges, as six bounds: causal query blocks that see part of it (masked),
    blocks that see all of it, the ragged last block (masked). QSPLIT: each clipped to this program's share of the
    query blocks (program_id(1) of num_programs(1) equal shares; `query_splits`)."""
    nq_whole = (NQ // BLOCK_M) * BLOCK_M
    if CAUSAL:
        lo = (n0 // BLOCK_M) * BLOCK_M  # the first query block that sees any of these keys
        full_lo = tl.minimum(tl.cdiv(n0 + BLOCK_N - 1, BLOCK_M) * BLOCK_M, nq_whole)  # blocks that see them all
        full_lo = tl.maximum(full_lo, lo)
    else:
        lo = 0
        full_lo = 0
    tail = tl.maximum(nq_whole, full_lo)
    if QSPLIT:
        share = tl.cdiv(tl.cdiv(NQ, BLOCK_M), tl.num_programs(1)) * BLOCK_M
        q0 = tl.program_id(1) * share
        q1 = q0 + share
        return (
            tl.maximum(lo, q0), tl.minimum(full_lo, q1), tl.maximum(full_lo, q0), tl.minimum(nq_whole, q1),
            tl.maximum(tail, q0), tl.minimum(NQ, q1),
        )  # fmt: skip
    return lo, full_lo, full_lo, nq_whole, tail, NQ


@triton.jit
def _store_partial(P, row0, offs_n, in_n, acc, COL: tl.constexpr, COLS: tl.constexpr, WIDTH: tl.constexpr):
    """acc (BLOCK_N, COLS) fp32 into columns [COL, COL + COLS) of rows row0 + offs_n (where in_n) of the partial
    buffer P (rows of WIDTH fp32 columns)."""
    ptrs = P + (row0 + offs_n.to(tl.int64))[:, None] * WIDTH + COL + tl.arange(0, COLS)[None, :]
    tl.store(ptrs, acc, mask=in_n[:, None])


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
    q_base,
    do_base,
    lse_base,
    delta_base,
    q_offs_a,
    q_offs_b,
    do_offs_a,
    do_offs_b,
    sqn,
    sdn,
    offs_n,
    rows,
    ok_a,
    ok_b,
    lo,
    hi,
    NQ,
    qk_scale,
    dq_base,
    dq_offs_a,
    dq_offs_b,
    sdqn,
    sm_scale,
    ds_desc,
    bh_q,
    n0,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr,
    CAUSAL: tl.constexpr,
    MASK_A: tl.constexpr,
    SPLIT: tl.constexpr,
    MASK_B: tl.constexpr,
    PREC: tl.constexpr,
    WRITE_DQ: tl.constexpr,
    STORE_DS: tl.constexpr,
):
    """Accumulate one key block's dK (unscaled) and dV over query blocks [lo, hi), read by pointers. WRITE_DQ (the
    only key block any query sees): also each query block's dQ = dS K scale, whole, into dq_base's rows. STORE_DS:
    each dS^T tile is also written through ds_desc, as `_dkdv_inner_tma` writes it."""
    for start_m in range(lo, hi, BLOCK_M):  # software-pipelined (num_stages)
        q_ptrs = q_base + tl.cast(start_m, tl.int64) * sqn
        do_ptrs = do_base + tl.cast(start_m, tl.int64) * sdn
        offs_m = start_m + rows
        in_m = offs_m < NQ
        q_a = _tile(q_ptrs + q_offs_a, in_m, ok_a, MASKED, MASK_A)
        do_a = _tile(do_ptrs + do_offs_a, in_m, ok_a, MASKED, MASK_A)
        if SPLIT:
            q_b = _tile(q_ptrs + q_offs_b, in_m, ok_b, MASKED, MASK_B)
            do_b = _tile(do_ptrs + do_offs_b, in_m, ok_b, MASKED, MASK_B)
        else:  # placeholders, never read
            q_b, do_b = q_a, do_a
        if MASKED:
            lse = tl.load(lse_base + offs_m, mask=in_m, other=0.0)
            delta = tl.load(delta_base + offs_m, mask=in_m, other=0.0)
        else:
            lse = tl.load(lse_base + offs_m)
            delta = tl.load(delta_base + offs_m)
        dk_a, dk_b, dv_a, dv_b, dst = _dkdv_step(
            dk_a, dk_b, dv_a, dv_b, k_a, k_b, v_a, v_b, q_a, q_b, do_a, do_b, lse, delta, offs_m, offs_n, in_m,
            qk_scale, MASKED, CAUSAL, SPLIT, PREC,
        )  # fmt: skip
        if WRITE_DQ:  # keys past NK were read as zeros: they add nothing
            dq_ptrs = dq_base + tl.cast(start_m, tl.int64) * sdqn
            ds = tl.trans(dst)
            dq_a = tl.dot(ds, k_a, input_precision=PREC) * sm_scale
            tl.store(dq_ptrs + dq_offs_a, dq_a.to(dq_base.dtype.element_ty), mask=in_m[:, None] & ok_a[None, :])
            if SPLIT:
                dq_b = tl.dot(ds, k_b, input_precision=PREC) * sm_scale
                tl.store(dq_ptrs + dq_offs_b, dq_b.to(dq_base.dtype.element_ty), mask=in_m[:, None] & ok_b[None, :])
        if STORE_DS:
            ds_desc.store([bh_q, n0, start_m], dst.reshape(1, BLOCK_N, BLOCK_M))
    return dk_a, dk_b, dv_a, dv_b


@triton.jit(do_not_specialize=["NQ", "NK", "NUM_N", "GROUP", "ORDER_HEADS"])  # lengths: no recompiles per N
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
    DKP,
    DVP,
    DQ,
    sdqz,
    sdqh,
    sdqn,
    sdqd,
    ds_desc,
    HKV,
    GROUP,
    NQ,
    NK,
    NUM_N,
    ORDER_HEADS,
    qk_scale,
    sm_scale,
    HEAD_DIM: tl.constexpr,
    ALIGN: tl.constexpr,
    DA: tl.constexpr,
    DB: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    QSPLIT: tl.constexpr,
    PREC: tl.constexpr,
    WRITE_DQ: tl.constexpr,
    STORE_DS: tl.constexpr,
):
    """dK, dV of BLOCK_N keys of head (z, hk), summed over its GROUP query heads. Grid: (NUM_N * Z * HKV, S).

    S = 1 (QSPLIT False): into DK and DV. S > 1: program (i, s) takes the s-th of S shares of the query blocks and
    writes its unscaled fp32 dK and dV into the partial buffers DKP, DVP ((S, Z, HKV, NK, DA + DB), contiguous),
    which the launcher sums over S in a fixed order. WRITE_DQ (NUM_N 1: one key block holds every key a query sees):
    each query block's dQ has no other term, so it is written here, whole, into DQ (no dQ kernel, deterministic).
    STORE_DS: every dS^T tile also goes to ds_desc, as in `attention_bwd_dkdv_tma_kernel` (unused otherwise)."""
    sqz, sqh, sqn = _aligned(sqz, sqh, sqn, ALIGN)
    skz, skh, skn = _aligned(skz, skh, skn, ALIGN)
    svz, svh, svn = _aligned(svz, svh, svn, ALIGN)
    sdz, sdh, sdn = _aligned(sdz, sdh, sdn, ALIGN)
    sdkz, sdkh, sdkn = _aligned(sdkz, sdkh, sdkn, ALIGN)
    sdvz, sdvh, sdvn = _aligned(sdvz, sdvh, sdvn, ALIGN)
    sdqz, sdqh, sdqn = _aligned(sdqz, sdqh, sdqn, ALIGN)
    SPLIT: tl.constexpr = DB > 0
    MASK_A: tl.constexpr = HEAD_DIM < DA
    MASK_B: tl.constexpr = HEAD_DIM < DA + DB
    qk_scale, sm_scale = tl.cast(qk_scale, tl.float32), tl.cast(sm_scale, tl.float32)  # fp64 under torch.compile
    bh, z, hk, block = _program(NUM_N, HKV, ORDER_HEADS, False, CAUSAL)
    n0 = block * BLOCK_N
    offs_n = n0 + tl.arange(0, BLOCK_N)
    rows = tl.arange(0, BLOCK_M)
    nrows = tl.arange(0, BLOCK_N)
    in_n = offs_n < NK
    k_ptrs = K + z.to(tl.int64) * skz + hk.to(tl.int64) * skh + n0.to(tl.int64) * skn + nrows[:, None] * skn
    v_ptrs = V + z.to(tl.int64) * svz + hk.to(tl.int64) * svh + n0.to(tl.int64) * svn + nrows[:, None] * svn
    dk_ptrs = DK + z.to(tl.int64) * sdkz + hk.to(tl.int64) * sdkh + n0.to(tl.int64) * sdkn + nrows[:, None] * sdkn
    dv_ptrs = DV + z.to(tl.int64) * sdvz + hk.to(tl.int64) * sdvh + n0.to(tl.int64) * sdvn + nrows[:, None] * sdvn
    offs_a = tl.arange(0, DA)
    ok_a = offs_a < HEAD_DIM
    k_a = _tile(k_ptrs + offs_a[None, :] * skd, in_n, ok_a, True, MASK_A)
    v_a = _tile(v_ptrs + offs_a[None, :] * svd, in_n, ok_a, True, MASK_A)
    dk_a = tl.zeros([BLOCK_N, DA], dtype=tl.float32)
    dv_a = tl.zeros([BLOCK_N, DA], dtype=tl.float32)
    q_offs_a = rows[:, None] * sqn + offs_a[None, :] * sqd
    do_offs_a = rows[:, None] * sdn + offs_a[None, :] * sdd
    dq_offs_a = rows[:, None] * sdqn + offs_a[None, :] * sdqd
    if SPLIT:
        offs_b = DA + tl.arange(0, DB)
        ok_b = offs_b < HEAD_DIM
        k_b = _tile(k_ptrs + offs_b[None, :] * skd, in_n, ok_b, True, MASK_B)
        v_b = _tile(v_ptrs + offs_b[None, :] * svd, in_n, ok_b, True, MASK_B)
        dk_b = tl.zeros([BLOCK_N, DB], dtype=tl.float32)
        dv_b = tl.zeros([BLOCK_N, DB], dtype=tl.float32)
        q_offs_b = rows[:, None] * sqn + offs_b[None, :] * sqd
        do_offs_b = rows[:, None] * sdn + offs_b[None, :] * sdd
        dq_offs_b = rows[:, None] * sdqn + offs_b[None, :] * sdqd
    else:  # placeholders, never read
        ok_b, k_b, v_b, dk_b, dv_b, q_offs_b, do_offs_b = ok_a, k_a, v_a, dk_a, dv_a, q_offs_a, do_offs_a
        dq_offs_b = dq_offs_a
    r0, r1, r2, r3, r4, r5 = _query_ranges(n0, NQ, BLOCK_M, BLOCK_N, CAUSAL, QSPLIT)
    # a `while` (not `for`): the interpreter takes no runtime range bound (see _fwd_inner); the inner loops stay `for`
    g = tl.full((), 0, tl.int32)
    while g < GROUP:
        h = hk * GROUP + g
        q_base = Q + z.to(tl.int64) * sqz + h.to(tl.int64) * sqh
        do_base = DO + z.to(tl.int64) * sdz + h.to(tl.int64) * sdh
        lse_base = LSE + (z * HKV * GROUP + h).to(tl.int64) * NQ
        delta_base = DELTA + (z * HKV * GROUP + h).to(tl.int64) * NQ
        dq_base = DQ + z.to(tl.int64) * sdqz + h.to(tl.int64) * sdqh
        bh_q = z * HKV * GROUP + h
        if CAUSAL:  # the diagonal's blocks, masked
            dk_a, dk_b, dv_a, dv_b = _dkdv_inner(
                dk_a, dk_b, dv_a, dv_b, k_a, k_b, v_a, v_b, q_base, do_base, lse_base, delta_base, q_offs_a,
                q_offs_b, do_offs_a, do_offs_b, sqn, sdn, offs_n, rows, ok_a, ok_b, r0, r1, NQ, qk_scale,
                dq_base, dq_offs_a, dq_offs_b, sdqn, sm_scale, ds_desc, bh_q, n0, BLOCK_M, BLOCK_N, True, True,
                MASK_A, SPLIT, MASK_B, PREC, WRITE_DQ, STORE_DS,
            )  # fmt: skip
        dk_a, dk_b, dv_a, dv_b = _dkdv_inner(
            dk_a, dk_b, dv_a, dv_b, k_a, k_b, v_a, v_b, q_base, do_base, lse_base, delta_base, q_offs_a,
            q_offs_b, do_offs_a, do_offs_b, sqn, sdn, offs_n, rows, ok_a, ok_b, r2, r3, NQ, qk_scale,
            dq_base, dq_offs_a, dq_offs_b, sdqn, sm_scale, ds_desc, bh_q, n0, BLOCK_M, BLOCK_N, False, False,
            MASK_A, SPLIT, MASK_B, PREC, WRITE_DQ, STORE_DS,
        )  # fmt: skip
        dk_a, dk_b, dv_a, dv_b = _dkdv_inner(
            dk_a, dk_b, dv_a, dv_b, k_a, k_b, v_a, v_b, q_base, do_base, lse_base, delta_base, q_offs_a,
            q_offs_b, do_offs_a, do_offs_b, sqn, sdn, offs_n, rows, ok_a, ok_b, r4, r5, NQ, qk_scale,
            dq_base, dq_offs_a, dq_offs_b, sdqn, sm_scale, ds_desc, bh_q, n0, BLOCK_M, BLOCK_N, True, CAUSAL,
            MASK_A, SPLIT, MASK_B, PREC, WRITE_DQ, STORE_DS,
        )  # fmt: skip
        g += 1
    if QSPLIT:
        row0 = (tl.program_id(1) * (tl.num_programs(0) // NUM_N) + bh).to(tl.int64) * NK
        _store_partial(DKP, row0, offs_n, in_n, dk_a, 0, DA, DA + DB)
        _store_partial(DVP, row0, offs_n, in_n, dv_a, 0, DA, DA + DB)
        if SPLIT:
            _store_partial(DKP, row0, offs_n, in_n, dk_b, DA, DB, DA + DB)
            _store_partial(DVP, row0, offs_n, in_n, dv_b, DA, DB, DA + DB)
    else:
        out_mask = in_n[:, None] & ok_a[None, :]
        tl.store(dk_ptrs + offs_a[None, :] * sdkd, (dk_a * sm_scale).to(DK.dtype.element_ty), mask=out_mask)
        tl.store(dv_ptrs + offs_a[None, :] * sdvd, dv_a.to(DV.dtype.element_ty), mask=out_mask)
        if SPLIT:
            out_mask = in_n[:, None] & ok_b[None, :]
            tl.store(dk_ptrs + offs_b[None, :] * sdkd, (dk_b * sm_scale).to(DK.dtype.element_ty), mask=out_mask)
            tl.store(dv_ptrs + offs_b[None, :] * sdvd, dv_b.to(DV.dtype.element_ty), mask=out_mask)


@triton.jit
def _dkdv_inner_tma(
    dk_a,
    dk_b,
    dv_a,
    dv_b,
    k_a,
    k_b,
    v_a,
    v_b,
    q_da,
    q_db,
    do_da,
    do_db,
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
    ds_desc,
    bh_q,
    n0,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DA: tl.constexpr,
    DB: tl.constexpr,
    MASKED: tl.constexpr,
    CAUSAL: tl.constexpr,
    STORE_DS: tl.constexpr,
    PREC: tl.constexpr,
):
    """`_dkdv_inner` with the query and output-gradient tiles read through the descriptors q_da, q_db, do_da, do_db
    (rows past NQ arrive as zeros). STORE_DS: each dS^T tile is also written through ds_desc (rows: query head
    bh_q's keys, columns its queries), for the dQ kernel to read instead of recomputing it."""
    for start_m in range(lo, hi, BLOCK_M):  # software-pipelined (num_stages)
        offs_m = start_m + rows
        in_m = offs_m < NQ
        q_a = q_da.load([z, h, start_m, 0]).reshape(BLOCK_M, DA)
        do_a = do_da.load([z, h, start_m, 0]).reshape(BLOCK_M, DA)
        if DB > 0:
            q_b = q_db.load([z, h, start_m, DA]).reshape(BLOCK_M, DB)
            do_b = do_db.load([z, h, start_m, DA]).reshape(BLOCK_M, DB)
        else:  # placeholders, never read
            q_b, do_b = q_a, do_a
        if MASKED:
            lse = tl.load(lse_base + offs_m, mask=in_m, other=0.0)
            delta = tl.load(delta_base + offs_m, mask=in_m, other=0.0)
        else:
            lse = tl.load(lse_base + offs_m)
            delta = tl.load(delta_base + offs_m)
        dk_a, dk_b, dv_a, dv_b, dst = _dkdv_step(
            dk_a, dk_b, dv_a, dv_b, k_a, k_b, v_a, v_b, q_a, q_b, do_a, do_b, lse, delta, offs_m, offs_n, in_m,
            qk_scale, MASKED, CAUSAL, DB > 0, PREC,
        )  # fmt: skip
        if STORE_DS:
            ds_desc.store([bh_q, n0, start_m], dst.reshape(1, BLOCK_N, BLOCK_M))
    return dk_a, dk_b, dv_a, dv_b


@triton.jit(do_not_specialize=["NQ", "NK", "NUM_N", "GROUP", "ORDER_HEADS"])  # lengths: no recompiles per N
def attention_bwd_dkdv_tma_kernel(
    q_da,
    q_db,
    k_da,
    k_db,
    v_da,
    v_db,
    do_da,
    do_db,
    LSE,
    DELTA,
    dk_da,
    dk_db,
    dv_da,
    dv_db,
    DKP,
    DVP,
    ds_desc,
    HKV,
    GROUP,
    NQ,
    NK,
    NUM_N,
    ORDER_HEADS,
    qk_scale,
    sm_scale,
    DA: tl.constexpr,
    DB: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    QSPLIT: tl.constexpr,
    STORE_DS: tl.constexpr,
    PREC: tl.constexpr,
):
    """`attention_bwd_dkdv_kernel` through tensor descriptors (blocks [1, 1, BLOCK_M or BLOCK_N, DA or DB]; the b
    descriptors unused when DB = 0, the dK and dV ones when QSPLIT). Same grid, outputs and math. STORE_DS: every
    dS^T tile it makes also goes to ds_desc ((Z x HQ, NK, NQ rounded up to 8), blocks [1, BLOCK_N, BLOCK_M]; unused
    otherwise), for `attention_bwd_dq_ds_kernel`."""
    qk_scale, sm_scale = tl.cast(qk_scale, tl.float32), tl.cast(sm_scale, tl.float32)  # fp64 under torch.compile
    bh, z, hk, block = _program(NUM_N, HKV, ORDER_HEADS, False, CAUSAL)
    n0 = block * BLOCK_N
    offs_n = n0 + tl.arange(0, BLOCK_N)
    rows = tl.arange(0, BLOCK_M)
    k_a = k_da.load([z, hk, n0, 0]).reshape(BLOCK_N, DA)
    v_a = v_da.load([z, hk, n0, 0]).reshape(BLOCK_N, DA)
    dk_a = tl.zeros([BLOCK_N, DA], dtype=tl.float32)
    dv_a = tl.zeros([BLOCK_N, DA], dtype=tl.float32)
    if DB > 0:
        k_b = k_db.load([z, hk, n0, DA]).reshape(BLOCK_N, DB)
        v_b = v_db.load([z, hk, n0, DA]).reshape(BLOCK_N, DB)
        dk_b = tl.zeros([BLOCK_N, DB], dtype=tl.float32)
        dv_b = tl.zeros([BLOCK_N, DB], dtype=tl.float32)
    else:  # placeholders, never read
        k_b, v_b, dk_b, dv_b = k_a, v_a, dk_a, dv_a
    r0, r1, r2, r3, r4, r5 = _query_ranges(n0, NQ, BLOCK_M, BLOCK_N, CAUSAL, QSPLIT)
    g = tl.full((), 0, tl.int32)
    while g < GROUP:
        h = hk * GROUP + g
        bh_q = z * HKV * GROUP + h
        lse_base = LSE + bh_q.to(tl.int64) * NQ
        delta_base = DELTA + bh_q.to(tl.int64) * NQ
        if CAUSAL:  # the diagonal's blocks, masked
            dk_a, dk_b, dv_a, dv_b = _dkdv_inner_tma(
                dk_a, dk_b, dv_a, dv_b, k_a, k_b, v_a, v_b, q_da, q_db, do_da, do_db, z, h, lse_base, delta_base,
                offs_n, rows, r0, r1, NQ, qk_scale, ds_desc, bh_q, n0, BLOCK_M, BLOCK_N, DA, DB, True, True,
                STORE_DS, PREC,
            )  # fmt: skip
        dk_a, dk_b, dv_a, dv_b = _dkdv_inner_tma(
            dk_a, dk_b, dv_a, dv_b, k_a, k_b, v_a, v_b, q_da, q_db, do_da, do_db, z, h, lse_base, delta_base,
            offs_n, rows, r2, r3, NQ, qk_scale, ds_desc, bh_q, n0, BLOCK_M, BLOCK_N, DA, DB, False, False,
            STORE_DS, PREC,
        )  # fmt: skip
        dk_a, dk_b, dv_a, dv_b = _dkdv_inner_tma(
            dk_a, dk_b, dv_a, dv_b, k_a, k_b, v_a, v_b, q_da, q_db, do_da, do_db, z, h, lse_base, delta_base,
            offs_n, rows, r4, r5, NQ, qk_scale, ds_desc, bh_q, n0, BLOCK_M, BLOCK_N, DA, DB, True, CAUSAL,
            STORE_DS, PREC,
        )  # fmt: skip
        g += 1
    if QSPLIT:
        row0 = (tl.program_id(1) * (tl.num_programs(0) // NUM_N) + bh).to(tl.int64) * NK
        in_n = offs_n < NK
        _store_partial(DKP, row0, offs_n, in_n, dk_a, 0, DA, DA + DB)
        _store_partial(DVP, row0, offs_n, in_n, dv_a, 0, DA, DA + DB)
        if DB > 0:
            _store_partial(DKP, row0, offs_n, in_n, dk_b, DA, DB, DA + DB)
            _store_partial(DVP, row0, offs_n, in_n, dv_b, DA, DB, DA + DB)
    else:
        dk_da.store([z, hk, n0, 0], (dk_a * sm_scale).to(dk_da.dtype).reshape(1, 1, BLOCK_N, DA))
        dv_da.store([z, hk, n0, 0], dv_a.to(dv_da.dtype).reshape(1, 1, BLOCK_N, DA))
        if DB > 0:
            dk_db.store([z, hk, n0, DA], (dk_b * sm_scale).to(dk_db.dtype).reshape(1, 1, BLOCK_N, DB))
            dv_db.store([z, hk, n0, DA], dv_b.to(dv_db.dtype).reshape(1, 1, BLOCK_N, DB))


@triton.jit(do_not_specialize=["ROWS", "NK", "SEEN"])  # lengths: no recompiles per N (PART: a multiple of 16)
def attention_bwd_sum_kernel(
    DKP, DVP, DK, DV, ROWS, NK, SEEN, SPLITS, PART, scale,
    HEAD_DIM: tl.constexpr, WIDTH: tl.constexpr, D_PAD: tl.constexpr, BLOCK_R: tl.constexpr,
):  # fmt: skip
    """DK = scale * (the sum of the SPLITS partial dK), DV = the sum of the partial dV, summed in split order
    (deterministic), for the ROWS = Z * HKV * NK rows whose key (row % NK) is below SEEN. DK, DV: contiguous
    (ROWS, HEAD_DIM); DKP, DVP: fp32 (SPLITS, ROWS, WIDTH), PART = ROWS * WIDTH elements a split. Grid:
    (cdiv(ROWS, BLOCK_R),)."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, D_PAD)
    mask = ((rows < ROWS) & ((rows % NK) < SEEN))[:, None] & (cols < HEAD_DIM)[None, :]
    offs = rows[:, None] * WIDTH + cols[None, :]
    dk = tl.zeros((BLOCK_R, D_PAD), tl.float32)
    dv = tl.zeros((BLOCK_R, D_PAD), tl.float32)
    for s in range(SPLITS):  # addresses from one offset tile: a tile of pointers carried through the loop spilled
        at = tl.cast(s, tl.int64) * PART  # in int32, s * PART wraps for many splits of many keys
        dk += tl.load(DKP + at + offs, mask=mask, other=0.0)
        dv += tl.load(DVP + at + offs, mask=mask, other=0.0)
    out = rows[:, None] * HEAD_DIM + cols[None, :]
    tl.store(DK + out, (dk * scale).to(DK.dtype.element_ty), mask=mask)
    tl.store(DV + out, dv.to(DV.dtype.element_ty), mask=mask)


@triton.jit
def attention_bwd_unseen_kernel(
    DK, DV, ROWS, NK, SEEN, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_R: tl.constexpr
):  # fmt: skip
    """Zeros into the dK and dV rows of the keys SEEN..NK - 1, which no query sees (top-left causal, NK > NQ): ROWS =
    Z * HKV * (NK - SEEN) rows. DK, DV: contiguous (Z * HKV * NK, HEAD_DIM). A kernel, not torch's zero_, so that a
    call replayed from C (launches only) writes them too. Grid: (cdiv(ROWS, BLOCK_R),)."""
    r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    unseen = NK - SEEN
    rows = (r // unseen) * NK + SEEN + r % unseen
    cols = tl.arange(0, D_PAD)
    mask = (r < ROWS)[:, None] & (cols < HEAD_DIM)[None, :]
    out = rows[:, None] * HEAD_DIM + cols[None, :]
    tl.store(DK + out, tl.zeros((BLOCK_R, D_PAD), DK.dtype.element_ty), mask=mask)
    tl.store(DV + out, tl.zeros((BLOCK_R, D_PAD), DV.dtype.element_ty), mask=mask)


@triton.jit
def _dq_step(
    dq_a,
    dq_b,
    q_a,
    q_b,
    do_a,
    do_b,
    k_a,
    k_b,
    v_a,
    v_b,
    lse,
    delta,
    offs_m,
    offs_k,
    NK,
    qk_scale,
    MASKED: tl.constexpr,
    CAUSAL: tl.constexpr,
    SPLIT: tl.constexpr,
    PREC: tl.constexpr,
):
    """One key block's share of one query block's dQ (unscaled): S = Q K^T, P = exp2(S c - L log2 e) (lse comes in
    base 2), dP = dO V^T, dS = P (dP - delta), dQ += dS K. MASKED: keys offs_k >= NK (and, CAUSAL, keys after the
    query) get no weight."""
    s = tl.dot(q_a, tl.trans(k_a), input_precision=PREC)
    dp = tl.dot(do_a, tl.trans(v_a), input_precision=PREC)
    if SPLIT:
        s = tl.dot(q_b, tl.trans(k_b), s, input_precision=PREC)
        dp = tl.dot(do_b, tl.trans(v_b), dp, input_precision=PREC)
    p = tl.math.exp2(s * qk_scale - lse[:, None])
    if MASKED:
        keep = (offs_k < NK)[None, :]
        if CAUSAL:
            keep = keep & (offs_k[None, :] <= offs_m[:, None])
        p = tl.where(keep, p, 0.0)
    ds = (p * (dp - delta[:, None])).to(k_a.dtype)
    dq_a = tl.dot(ds, k_a, dq_a, input_precision=PREC)
    if SPLIT:
        dq_b = tl.dot(ds, k_b, dq_b, input_precision=PREC)
    return dq_a, dq_b


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
    k_base,
    v_base,
    k_offs_a,
    k_offs_b,
    v_offs_a,
    v_offs_b,
    skn,
    svn,
    offs_m,
    offs_n,
    ok_a,
    ok_b,
    lo,
    hi,
    NK,
    qk_scale,
    BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr,
    CAUSAL: tl.constexpr,
    MASK_A: tl.constexpr,
    SPLIT: tl.constexpr,
    MASK_B: tl.constexpr,
    PREC: tl.constexpr,
):
    """Accumulate one query block's dQ (unscaled) over key blocks [lo, hi), read by pointers."""
    for start_n in range(lo, hi, BLOCK_N):  # software-pipelined (num_stages)
        k_ptrs = k_base + tl.cast(start_n, tl.int64) * skn
        v_ptrs = v_base + tl.cast(start_n, tl.int64) * svn
        in_n = (start_n + offs_n) < NK
        k_a = _tile(k_ptrs + k_offs_a, in_n, ok_a, MASKED, MASK_A)
        v_a = _tile(v_ptrs + v_offs_a, in_n, ok_a, MASKED, MASK_A)
        if SPLIT:
            k_b = _tile(k_ptrs + k_offs_b, in_n, ok_b, MASKED, MASK_B)
            v_b = _tile(v_ptrs + v_offs_b, in_n, ok_b, MASKED, MASK_B)
        else:  # placeholders, never read
            k_b, v_b = k_a, v_a
        dq_a, dq_b = _dq_step(
            dq_a, dq_b, q_a, q_b, do_a, do_b, k_a, k_b, v_a, v_b, lse, delta, offs_m, start_n + offs_n, NK, qk_scale,
            MASKED, CAUSAL, SPLIT, PREC,
        )  # fmt: skip
    return dq_a, dq_b


@triton.jit(do_not_specialize=["NQ", "NK", "NUM_M", "GROUP", "ORDER_HEADS"])  # lengths: no recompiles per N
def attention_bwd_dq_kernel(
    Q,
    K,
    V,
    DO,
    LSE,
    DELTA,
    O,  # noqa: E741  (the papers' name)
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
    soz,
    soh,
    son,
    sod,
    sdqz,
    sdqh,
    sdqn,
    sdqd,
    HQ,
    GROUP,
    NQ,
    NK,
    NUM_M,
    ORDER_HEADS,
    qk_scale,
    sm_scale,
    HEAD_DIM: tl.constexpr,
    ALIGN: tl.constexpr,
    DA: tl.constexpr,
    DB: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    PREC: tl.constexpr,
    WRITE_DELTA: tl.constexpr,
):
    """dQ of BLOCK_M queries of head (z, h), looping over key blocks. Grid: (NUM_M * Z * HQ,). WRITE_DELTA: their
    delta = rowsum(O * dO) from O here, stored for the dK/dV kernel launched after (`_block_delta`); else read from
    DELTA (O unused)."""
    sqz, sqh, sqn = _aligned(sqz, sqh, sqn, ALIGN)
    skz, skh, skn = _aligned(skz, skh, skn, ALIGN)
    svz, svh, svn = _aligned(svz, svh, svn, ALIGN)
    sdz, sdh, sdn = _aligned(sdz, sdh, sdn, ALIGN)
    soz, soh, son = _aligned(soz, soh, son, ALIGN)
    sdqz, sdqh, sdqn = _aligned(sdqz, sdqh, sdqn, ALIGN)
    SPLIT: tl.constexpr = DB > 0
    MASK_A: tl.constexpr = HEAD_DIM < DA
    MASK_B: tl.constexpr = HEAD_DIM < DA + DB
    qk_scale, sm_scale = tl.cast(qk_scale, tl.float32), tl.cast(sm_scale, tl.float32)  # fp64 under torch.compile
    bh, z, h, block = _program(NUM_M, HQ, ORDER_HEADS, CAUSAL, CAUSAL)
    hk = h // GROUP
    m0 = block * BLOCK_M
    rows = tl.arange(0, BLOCK_M)
    offs_m = m0 + rows
    offs_n = tl.arange(0, BLOCK_N)
    in_m = offs_m < NQ
    q_ptrs = Q + z.to(tl.int64) * sqz + h.to(tl.int64) * sqh + m0.to(tl.int64) * sqn + rows[:, None] * sqn
    do_ptrs = DO + z.to(tl.int64) * sdz + h.to(tl.int64) * sdh + m0.to(tl.int64) * sdn + rows[:, None] * sdn
    dq_ptrs = DQ + z.to(tl.int64) * sdqz + h.to(tl.int64) * sdqh + m0.to(tl.int64) * sdqn + rows[:, None] * sdqn
    lse = tl.load(LSE + bh.to(tl.int64) * NQ + offs_m, mask=in_m, other=0.0) * 1.4426950408889634
    k_base = K + z.to(tl.int64) * skz + hk.to(tl.int64) * skh
    v_base = V + z.to(tl.int64) * svz + hk.to(tl.int64) * svh
    offs_a = tl.arange(0, DA)
    ok_a = offs_a < HEAD_DIM
    q_a = _tile(q_ptrs + offs_a[None, :] * sqd, in_m, ok_a, True, MASK_A)
    do_a = _tile(do_ptrs + offs_a[None, :] * sdd, in_m, ok_a, True, MASK_A)
    k_offs_a = offs_n[:, None] * skn + offs_a[None, :] * skd
    v_offs_a = offs_n[:, None] * svn + offs_a[None, :] * svd
    dq_a = tl.zeros([BLOCK_M, DA], dtype=tl.float32)
    if SPLIT:
        offs_b = DA + tl.arange(0, DB)
        ok_b = offs_b < HEAD_DIM
        q_b = _tile(q_ptrs + offs_b[None, :] * sqd, in_m, ok_b, True, MASK_B)
        do_b = _tile(do_ptrs + offs_b[None, :] * sdd, in_m, ok_b, True, MASK_B)
        k_offs_b = offs_n[:, None] * skn + offs_b[None, :] * skd
        v_offs_b = offs_n[:, None] * svn + offs_b[None, :] * svd
        dq_b = tl.zeros([BLOCK_M, DB], dtype=tl.float32)
    else:  # placeholders, never read
        ok_b, q_b, do_b, k_offs_b, v_offs_b, dq_b = ok_a, q_a, do_a, k_offs_a, v_offs_a, dq_a
    if WRITE_DELTA:
        delta = _block_delta(
            O, DO, DELTA, z, h, bh, m0, soz, soh, son, sod, sdz, sdh, sdn, sdd, NQ, HEAD_DIM, DA, DB, BLOCK_M
        )  # fmt: skip
    else:
        delta = tl.load(DELTA + bh.to(tl.int64) * NQ + offs_m, mask=in_m, other=0.0)
    full_hi, hi = _key_ranges(m0, NK, BLOCK_M, BLOCK_N, CAUSAL)
    dq_a, dq_b = _dq_inner(
        dq_a, dq_b, q_a, q_b, do_a, do_b, lse, delta, k_base, v_base, k_offs_a, k_offs_b, v_offs_a, v_offs_b, skn,
        svn, offs_m, offs_n, ok_a, ok_b, 0, full_hi, NK, qk_scale, BLOCK_N, False, CAUSAL, MASK_A, SPLIT, MASK_B,
        PREC,
    )  # fmt: skip
    dq_a, dq_b = _dq_inner(
        dq_a, dq_b, q_a, q_b, do_a, do_b, lse, delta, k_base, v_base, k_offs_a, k_offs_b, v_offs_a, v_offs_b, skn,
        svn, offs_m, offs_n, ok_a, ok_b, full_hi, hi, NK, qk_scale, BLOCK_N, True, CAUSAL, MASK_A, SPLIT, MASK_B,
        PREC,
    )  # fmt: skip
    tl.store(
        dq_ptrs + offs_a[None, :] * sdqd, (dq_a * sm_scale).to(DQ.dtype.element_ty), mask=in_m[:, None] & ok_a[None, :]
    )
    if SPLIT:
        tl.store(
            dq_ptrs + offs_b[None, :] * sdqd,
            (dq_b * sm_scale).to(DQ.dtype.element_ty),
            mask=in_m[:, None] & ok_b[None, :],
        )


@triton.jit
def _dq_inner_tma(
    dq_a,
    dq_b,
    q_a,
    q_b,
    do_a,
    do_b,
    lse,
    delta,
    k_da,
    k_db,
    v_da,
    v_db,
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
    PREC: tl.constexpr,
):
    """`_dq_inner` with the key and value tiles read through the descriptors k_da, k_db, v_da, v_db (rows past NK
    arrive as zeros)."""
    for start_n in range(lo, hi, BLOCK_N):  # software-pipelined (num_stages)
        k_a = k_da.load([z, hk, start_n, 0]).reshape(BLOCK_N, DA)
        v_a = v_da.load([z, hk, start_n, 0]).reshape(BLOCK_N, DA)
        if DB > 0:
            k_b = k_db.load([z, hk, start_n, DA]).reshape(BLOCK_N, DB)
            v_b = v_db.load([z, hk, start_n, DA]).reshape(BLOCK_N, DB)
        else:  # placeholders, never read
            k_b, v_b = k_a, v_a
        dq_a, dq_b = _dq_step(
            dq_a, dq_b, q_a, q_b, do_a, do_b, k_a, k_b, v_a, v_b, lse, delta, offs_m, start_n + offs_n, NK, qk_scale,
            MASKED, CAUSAL, DB > 0, PREC,
        )  # fmt: skip
    return dq_a, dq_b


@triton.jit(do_not_specialize=["NQ", "NK", "NUM_M", "GROUP", "ORDER_HEADS"])  # lengths: no recompiles per N
def attention_bwd_dq_tma_kernel(
    q_da,
    q_db,
    k_da,
    k_db,
    v_da,
    v_db,
    do_da,
    do_db,
    LSE,
    DELTA,
    O,  # noqa: E741  (the papers' name)
    soz,
    soh,
    son,
    sod,
    DO,
    sdz,
    sdh,
    sdn,
    sdd,
    dq_da,
    dq_db,
    HQ,
    GROUP,
    NQ,
    NK,
    NUM_M,
    ORDER_HEADS,
    qk_scale,
    sm_scale,
    HEAD_DIM: tl.constexpr,
    ALIGN: tl.constexpr,
    DA: tl.constexpr,
    DB: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    PREC: tl.constexpr,
    WRITE_DELTA: tl.constexpr,
):
    """`attention_bwd_dq_kernel` through tensor descriptors (blocks [1, 1, BLOCK_M or BLOCK_N, DA or DB]; the b
    descriptors unused when DB = 0; O and DO by pointers (any strides) for delta, WRITE_DELTA). Same grid, outputs and
    math."""
    soz, soh, son = _aligned(soz, soh, son, ALIGN)
    sdz, sdh, sdn = _aligned(sdz, sdh, sdn, ALIGN)
    qk_scale, sm_scale = tl.cast(qk_scale, tl.float32), tl.cast(sm_scale, tl.float32)  # fp64 under torch.compile
    bh, z, h, block = _program(NUM_M, HQ, ORDER_HEADS, CAUSAL, CAUSAL)
    hk = h // GROUP
    m0 = block * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    in_m = offs_m < NQ
    lse = tl.load(LSE + bh.to(tl.int64) * NQ + offs_m, mask=in_m, other=0.0) * 1.4426950408889634
    q_a = q_da.load([z, h, m0, 0]).reshape(BLOCK_M, DA)
    do_a = do_da.load([z, h, m0, 0]).reshape(BLOCK_M, DA)
    dq_a = tl.zeros([BLOCK_M, DA], dtype=tl.float32)
    if DB > 0:
        q_b = q_db.load([z, h, m0, DA]).reshape(BLOCK_M, DB)
        do_b = do_db.load([z, h, m0, DA]).reshape(BLOCK_M, DB)
        dq_b = tl.zeros([BLOCK_M, DB], dtype=tl.float32)
    else:  # placeholders, never read
        q_b, do_b, dq_b = q_a, do_a, dq_a
    if WRITE_DELTA:
        delta = _block_delta(
            O, DO, DELTA, z, h, bh, m0, soz, soh, son, sod, sdz, sdh, sdn, sdd, NQ, HEAD_DIM, DA, DB, BLOCK_M
        )  # fmt: skip
    else:
        delta = tl.load(DELTA + bh.to(tl.int64) * NQ + offs_m, mask=in_m, other=0.0)
    full_hi, hi = _key_ranges(m0, NK, BLOCK_M, BLOCK_N, CAUSAL)
    dq_a, dq_b = _dq_inner_tma(
        dq_a, dq_b, q_a, q_b, do_a, do_b, lse, delta, k_da, k_db, v_da, v_db, z, hk, offs_m, offs_n, 0, full_hi, NK,
        qk_scale, BLOCK_N, DA, DB, False, CAUSAL, PREC,
    )  # fmt: skip
    dq_a, dq_b = _dq_inner_tma(
        dq_a, dq_b, q_a, q_b, do_a, do_b, lse, delta, k_da, k_db, v_da, v_db, z, hk, offs_m, offs_n, full_hi, hi, NK,
        qk_scale, BLOCK_N, DA, DB, True, CAUSAL, PREC,
    )  # fmt: skip
    dq_da.store([z, h, m0, 0], (dq_a * sm_scale).to(dq_da.dtype).reshape(1, 1, BLOCK_M, DA))
    if DB > 0:
        dq_db.store([z, h, m0, DA], (dq_b * sm_scale).to(dq_db.dtype).reshape(1, 1, BLOCK_M, DB))


@triton.jit
def _dq_ds_inner(
    dq_a,
    dq_b,
    ds_desc,
    k_da,
    k_db,
    bh,
    z,
    hk,
    m0,
    offs_m,
    offs_n,
    lo,
    hi,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DA: tl.constexpr,
    DB: tl.constexpr,
    MASKED: tl.constexpr,
    CAUSAL: tl.constexpr,
    PREC: tl.constexpr,
):
    """dQ += dS K over the key blocks [lo, hi), dS^T read through ds_desc (rows past NK arrive as zeros). MASKED and
    CAUSAL: scores of keys after the query are zeroed (the dK/dV kernel wrote zeros there, or nothing)."""
    for start_n in range(lo, hi, BLOCK_N):  # software-pipelined (num_stages)
        dst = ds_desc.load([bh, start_n, m0]).reshape(BLOCK_N, BLOCK_M)
        if MASKED and CAUSAL:
            dst = tl.where(offs_m[None, :] >= (start_n + offs_n)[:, None], dst, 0.0)
        ds = tl.trans(dst)
        dq_a = tl.dot(ds, k_da.load([z, hk, start_n, 0]).reshape(BLOCK_N, DA), dq_a, input_precision=PREC)
        if DB > 0:
            dq_b = tl.dot(ds, k_db.load([z, hk, start_n, DA]).reshape(BLOCK_N, DB), dq_b, input_precision=PREC)
    return dq_a, dq_b


@triton.jit(do_not_specialize=["NQ", "NK", "NUM_M", "GROUP", "ORDER_HEADS"])  # lengths: no recompiles per N
def attention_bwd_dq_ds_kernel(
    ds_desc,
    k_da,
    k_db,
    dq_da,
    dq_db,
    HQ,
    GROUP,
    NQ,
    NK,
    NUM_M,
    ORDER_HEADS,
    sm_scale,
    DA: tl.constexpr,
    DB: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    PREC: tl.constexpr,
):
    """dQ = dS K * scale from the dS^T the dK/dV kernel stored (ds_desc: (Z x HQ, NK, NQ rounded up to 8), blocks
    [1, BLOCK_N, BLOCK_M]): one product a tile pair, where `attention_bwd_dq_tma_kernel` recomputes S and dP first.
    One program per BLOCK_M queries of one head, as there; k and dq descriptors as there."""
    sm_scale = tl.cast(sm_scale, tl.float32)  # fp64 under torch.compile
    bh, z, h, block = _program(NUM_M, HQ, ORDER_HEADS, CAUSAL, CAUSAL)
    hk = h // GROUP
    m0 = block * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    dq_a = tl.zeros([BLOCK_M, DA], dtype=tl.float32)
    dq_b = tl.zeros([BLOCK_M, DB], dtype=tl.float32) if DB > 0 else dq_a  # else a placeholder, never read
    full_hi, hi = _key_ranges(m0, NK, BLOCK_M, BLOCK_N, CAUSAL)
    dq_a, dq_b = _dq_ds_inner(
        dq_a, dq_b, ds_desc, k_da, k_db, bh, z, hk, m0, offs_m, offs_n, 0, full_hi, BLOCK_M, BLOCK_N, DA, DB, False,
        CAUSAL, PREC,
    )  # fmt: skip
    dq_a, dq_b = _dq_ds_inner(
        dq_a, dq_b, ds_desc, k_da, k_db, bh, z, hk, m0, offs_m, offs_n, full_hi, hi, BLOCK_M, BLOCK_N, DA, DB, True,
        CAUSAL, PREC,
    )  # fmt: skip
    dq_da.store([z, h, m0, 0], (dq_a * sm_scale).to(dq_da.dtype).reshape(1, 1, BLOCK_M, DA))
    if DB > 0:
        dq_db.store([z, h, m0, DA], (dq_b * sm_scale).to(dq_db.dtype).reshape(1, 1, BLOCK_M, DB))


TRITON_KERNELS = (
    attention_fwd_kernel,
    attention_fwd_tma_kernel,
    attention_bwd_delta_kernel,
    attention_bwd_dkdv_kernel,
    attention_bwd_dkdv_tma_kernel,
    attention_bwd_sum_kernel,
    attention_bwd_unseen_kernel,
    attention_bwd_dq_kernel,
    attention_bwd_dq_tma_kernel,
    attention_bwd_dq_ds_kernel,
)


# ---------------------------------------------------------------------------------------------- plans


@dataclass(frozen=True)
class Plan:
    """One kernel's launch: BLOCK_M queries x BLOCK_N keys per tile, warps, pipeline stages."""

    block_m: int
    block_n: int
    warps: int
    stages: int


KERNELS = ("fwd", "dkdv", "dq")  # the kernels `fuselab tune attention` tunes
DQ_DS = "dqds"  # the dQ kernel of stored scores (`ds_plan`): forced by this name, fitted by the rule, not tuned


def row_align(*tensors: torch.Tensor) -> int:
    """ALIGN of the kernels that read by pointers (`_aligned`): the most elements, a power of 2 of at most 16 bytes,
    that divide every stride of `tensors` but the last (the head dim's). 8 for contiguous 16-bit heads of 40 or 200
    columns, whose rows Triton would otherwise read 2-4 bytes at a time; 2 for heads of 34."""
    strides = [s for t in tensors for s in t.stride()[:-1]]
    align = 16 // tensors[0].element_size()
    while align > 1 and any(s % align for s in strides):
        align //= 2
    return align


def d_pad(d: int) -> int:
    """The head dim padded to a power of two, at least 16 (tl.dot's smallest)."""
    return max(16, 1 << (d - 1).bit_length())  # triton.next_power_of_2 is a constexpr function: slow on the host


def d_chunks(d: int) -> tuple[int, int]:
    """The head dim as the kernels' tiles hold it: (DA, DB) columns, powers of two >= 16, DB = 0 for one chunk.

    Past 64 columns, two chunks where they pad less than one: 80 -> 64 + 16 and 96 -> 64 + 32 (not 128: 37% and 25%
    of the tensor cores' work on zeros; 128 took 1.07-1.21x their time), 160 -> 128 + 32, 192 -> 128 + 64; 112 -> 128
    (64 + 64 pads the same). Up to 64, one: 48 as 32 + 16 took 1.03-1.15x the time of 48 padded to 64 (timed on an
    H100, forward + backward, 6 shapes; docs/ops/attention.md, "Heads of 33-48 in one chunk").
    """
    whole = d_pad(d)
    if d <= 64 or d == whole:
        return whole, 0
    first = whole // 2
    second = d_pad(d - first)
    return (first, second) if first + second < whole else (whole, 0)


def tma_chunks(d: int) -> tuple[int, int]:
    """The head dim's chunks in the TMA forward and the stored scores' dQ kernel: d_chunks', except that one chunk
    past 128 columns (heads of 193-256: one of 256, past what one TMA copy takes) is held as 128 + 128, so that they go
    by TMA there too (the forward: 0.41-0.85x the pointer forward's time on an H100; docs/ops/attention.md, session
    48). The dK/dV kernel and the recomputing dQ kernel keep their pointer kernels there (`backward`): the recomputing
    dQ by TMA in two chunks made forward + backward 1.05-1.11x slower."""
    da, db = d_chunks(d)
    return (128, da - 128) if da > 128 and db == 0 else (da, db)


def tma_forward_plan(plan: Plan, db: int) -> Plan:
    """`plan` for the TMA forward of a head in two chunks (`db` > 0 columns in the second): at least 2 stages where it
    takes 128 keys or more a block. Triton 3.6 compiles such a forward on 1 stage to read shared memory past its
    allocation (compute-sanitizer, on an H100: d 72-96 faulted at 64 x 128 on 1 stage; 2 stages, 64 keys or one chunk
    ran; docs/ops/attention.md, session 53). No rule or table gives that plan; a forced one (a sweep, the tuner)
    would."""
    return replace(plan, stages=2) if db > 0 and plan.block_n >= 128 and plan.stages < 2 else plan


def d_work(d: int) -> int:
    """The columns of the head dim the tensor cores multiply: d padded chunk by chunk (d_chunks)."""
    return sum(d_chunks(d))


def dq_tile_rows(d: int, warps: int) -> int:
    """The most query rows a dK/dV tile takes where the kernel also writes dQ (one key block): its fp32 dQ tile
    (rows x d_work) at most 32 values a thread, at least 16 rows. Compiled for sm_90 (attention_offline_audit.py),
    tiles of 64 queries x 16 keys on 2 warps at d 80-96 spilled 552-948 bytes a thread, 16 x 16 72-196."""
    rows = 32 * 32 * warps // d_work(d)
    return max(16, 1 << (rows.bit_length() - 1)) if rows > 0 else 16


SHORT_BELOW = 1000  # tokens (the longer of N_q, N_k): sequences shorter are of the "short" class (`n_class`)


def n_class(nq: int, nk: int) -> str:
    """The sequences' length class in the plan table: "short" below SHORT_BELOW tokens, else "long"."""
    return "short" if max(nq, nk) < SHORT_BELOW else "long"


def plan_key(kernel: str, d: int, dtype: torch.dtype, causal: bool, length: str = "long") -> str:
    """The plan table's key: kernel, the head dim as the tiles hold it (d_work), element size, causal, and for the
    short class (`n_class`) "|short"."""
    key = f"{kernel}|d{d_work(d)}|{dtype.itemsize * 8}bit|{'causal' if causal else 'full'}"
    return key if length == "long" else f"{key}|{length}"


def rule_plan(kernel: str, d: int, dtype: torch.dtype, causal: bool) -> Plan:
    """The plan by rule, from the bytes one tile row holds (d_work x element size).

    16-bit rows up to 256 bytes (d <= 128): what tuning chose at d 80, 96 and 128 on the H200 and what timing found
    best at d 48 too (docs/ops/attention.md): forward 64 x 64, dK/dV 32 queries x 64 keys, dQ 64 x 64, 4 warps; rows
    up to 64 bytes (d <= 32), whose accumulators are small, dK/dV on 128 keys (0.87-0.95x forward + backward at d 24
    and 32 on an H100, 7 of 8 settings; docs/ops/attention.md, session 66). Past
    d 128, so that K/V stages fit: forward 64 x 32, dK/dV 32 x 64 (32 x 32 on 2 stages past d 192, where 64 keys'
    accumulators spill), dQ 64 x 32, 4 warps; halved past d 256. fp32 to d 64 (its registers): forward 128 x 64 (4
    warps to 128-byte rows, 8 past), dK/dV 64 x 128 (8 warps; 32 x 128 past 128 bytes), dQ 128 x 64 (8 warps; 128 x
    32 past 128 bytes). fp32 past d 64, whose "ieee" products ptxas unrolls into FMAs: forward and dQ 16 x 32, dK/dV
    32 x 16 (16 x 16 past d 128), 4 warps, at most 512 FMAs a thread a product. Under the interpreter: 16 x 16.
    """
    if _interpreter_plans():
        return Plan(16, 16, 1, 1)
    row = d_work(d) * dtype.itemsize
    if dtype.itemsize == 2:
        if row <= 256:
            dkdv = Plan(32, 128, 4, 3) if row <= 64 else Plan(32, 64, 4, 3)
            return {"fwd": Plan(64, 64, 4, 3), "dkdv": dkdv, "dq": Plan(64, 64, 4, 3)}[kernel]
        if row <= 512:  # past d 128: tiles halved so that K/V stages fit in shared memory; dK/dV's fp32
            # accumulators (2 x keys x d_work) at most 192 values a thread: 32 keys past d 192
            dkdv = Plan(32, 64, 4, 1) if row <= 384 else Plan(32, 32, 4, 2)
            return {"fwd": Plan(64, 32, 4, 2), "dkdv": dkdv, "dq": Plan(64, 32, 4, 1)}[kernel]
        return {"fwd": Plan(32, 32, 4, 1), "dkdv": Plan(16, 32, 4, 1), "dq": Plan(32, 16, 4, 1)}[kernel]  # past d 256
    if row > 256:  # fp32 past d 64: "ieee" products, unrolled into FMAs; at most 16 x 32 x 128 of them a product
        # (512 a thread of 4 warps), so that the tiles stay in registers
        if row > 512:
            return Plan(16, 16, 4, 1)
        return {"fwd": Plan(16, 32, 4, 1), "dkdv": Plan(32, 16, 4, 1), "dq": Plan(16, 32, 4, 1)}[kernel]
    if kernel == "fwd":
        return Plan(128, 64, 4, 3) if row <= 128 else Plan(128, 64, 8, 3)
    if kernel == "dkdv":
        return Plan(64, 128, 8, 3) if row <= 128 else Plan(32, 128, 8, 2)
    return Plan(128, 64, 8, 3) if row <= 128 else Plan(128, 32, 8, 2)  # dq


@functools.cache
def _device_info(index: int) -> tuple[str, int, int]:
    """(the key of the plan table it reads, SM count, compute capability's major number) of CUDA device `index`."""
    props = torch.cuda.get_device_properties(index)
    return tuning.reading_key(FOLDER, index), props.multi_processor_count, props.major


tuning.on_table_written(_device_info.cache_clear)  # the table a GPU reads may be its own once tuned


def _gpu(device: torch.device) -> tuple[str, int, int] | None:
    """_device_info of the GPU launches on `device` are planned for: the one `tuning.planning_as` names, else a CUDA
    device's own (not under the interpreter); None: the interpreter's plans."""
    model = tuning.planning_for()
    if model is not None:
        return model.key, model.sms, model.major
    return _device_info(_index(device)) if device.type == "cuda" and not INTERPRET else None


def _interpreter_plans() -> bool:
    """Whether launches take the interpreter's small tiles: under it, unless planned as a GPU."""
    return INTERPRET and tuning.planning_for() is None


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
    kernel: str, d: int, dtype: torch.dtype, causal: bool, device: torch.device, nq: int, nk: int, heads: int
) -> Plan:
    """The tuned plan for this GPU if its table has one (of the shape's length class, else of the long one), else the
    rule's, fitted to the shape (`fit_plan`); chosen once per argument set (`_PLANS`)."""
    if kernel in FORCED:
        return FORCED[kernel]
    return _PLANS.get(
        (kernel, d, dtype, causal, device, nq, nk, heads),
        lambda: _choose_plan(kernel, d, dtype, causal, device, nq, nk, heads),
    )


_PLANS = tuning.Prepared()  # choose_plan's answers; cleared when a plan table is written


def _choose_plan(
    kernel: str, d: int, dtype: torch.dtype, causal: bool, device: torch.device, nq: int, nk: int, heads: int
) -> Plan:
    gpu = _gpu(device)
    if gpu is None:
        return rule_plan(kernel, d, dtype, causal)
    key, sms, _ = gpu
    length = n_class(nq, nk)
    plan = table_plan(kernel, d, dtype, causal, tuning.load_table(FOLDER, key), length)
    if kernel == "fwd" and dtype.itemsize == 2 and length == "long":
        plan = padded_head_forward(plan, d)
    plan = fit_plan(kernel, plan, nq, nk, heads, sms, d_work(d) * dtype.itemsize)
    if kernel == "dkdv" and dtype.itemsize == 2:
        plan = short_loop_stages(plan, nq, causal)
    return plan


PADDED_HEAD_FORWARD = Plan(128, 64, 4, 3)  # the 16-bit forward of heads of 33-40 columns, long sequences


def padded_head_forward(plan: Plan, d: int) -> Plan:
    """PADDED_HEAD_FORWARD for heads of 33-40 columns (Stable Diffusion's 40), which run the d-64 key's tiles padded
    to 64: 128 queries x 64 keys on 3 stages, in place of the table's 64 x 128 on 2 (tuned at d 64). On an H100, at
    long sequences, it took 0.58-0.64x the forward's time at d 40 (six shapes, both masks), 0.81-0.88x forward +
    backward; at d 56 0.86-0.89x, at d 48 0.99-1.10x, at d 64 1.13-1.22x (docs/ops/attention.md, sessions 67-68)."""
    return PADDED_HEAD_FORWARD if d_work(d) == 64 and d <= 40 else plan


SHORT_LOOP_BLOCKS = 12  # query blocks a dK/dV program visits on average, at most, for it to take 2 stages


def short_loop_stages(plan: Plan, nq: int, causal: bool) -> Plan:
    """A 16-bit dK/dV plan of 3 stages or more, where its programs' query loops are short (on average at most
    SHORT_LOOP_BLOCKS blocks of block_m: nq / block_m, half that under the causal mask), on 2 stages: the pipeline's
    fill and drain are a large share of a short loop. On an H100 (causal, d 48-64, 64 x 64 tiles), 2 stages took
    0.955-0.983x the forward + backward time of 3 at loops of 8-12 blocks, 1.016-1.080x at 16-128
    (docs/ops/attention.md, session 66)."""
    blocks = triton.cdiv(nq, plan.block_m) / (2 if causal else 1)
    return replace(plan, stages=2) if plan.stages >= 3 and blocks <= SHORT_LOOP_BLOCKS else plan


def table_plan(
    kernel: str, d: int, dtype: torch.dtype, causal: bool, table: Mapping[str, Mapping], length: str = "long"
) -> Plan:
    """The plan before it is fitted to a shape: `table`'s for the length class, else its long class's, else the
    rule's."""
    tuned = table.get(plan_key(kernel, d, dtype, causal, length), table.get(plan_key(kernel, d, dtype, causal)))
    return Plan(**tuned) if tuned else rule_plan(kernel, d, dtype, causal)


@contextlib.contextmanager
def _overriding(stack: list[bool], value: bool) -> Iterator[None]:
    """Within the block, a rule's answer is `value` (its override `stack`, innermost last), whatever it would say."""
    stack.append(value)
    try:
        yield
    finally:
        stack.pop()


_FORCED_DELTA: list[bool] = []  # the rule overridden by `forced_delta_in_dq` (A/B runs, tests): innermost last


def forced_delta_in_dq(on: bool) -> contextlib.AbstractContextManager[None]:
    """Within the block, the recomputing dQ kernel writes delta (True) or reads the delta kernel's (False), whatever
    `delta_in_dq` says."""
    return _overriding(_FORCED_DELTA, on)


def delta_in_dq(dtype: torch.dtype) -> bool:
    """Whether the dQ kernel that recomputes S and dP computes delta = rowsum(O * dO) itself (it loads dO anyway) and
    runs before the dK/dV kernel, in place of `attention_bwd_delta_kernel`: for 16-bit tiles. fp32's tiles fill the
    registers already: with O's tile too, the dQ kernel at d 128 (16 x 32 on 4 warps, sm_90) spilled 548 bytes a
    thread, so fp32 keeps the delta kernel."""
    if _FORCED_DELTA:
        return _FORCED_DELTA[-1]
    return dtype.itemsize == 2


_FORCED_STORE: list[bool] = []  # the rule overridden by `forced_stored_scores` (sweeps, tests): innermost last
SCORES_MAX_BYTES = 256 * 2**20  # the stored dS's size limit (heads x nk x nq 16-bit values), a workspace kept


def forced_stored_scores(store: bool) -> contextlib.AbstractContextManager[None]:
    """Within the block, the TMA backward stores dS for dQ (True) or recomputes it (False), whatever the rule says."""
    return _overriding(_FORCED_STORE, store)


def stores_scores(d: int, heads: int, nq: int, nk: int) -> bool:
    """Whether the backward of tensors TMA can address has the dK/dV kernel (TMA or, at heads of 193-256, pointers)
    store dS (heads x nk x nq 16-bit values) for a dQ kernel of one product a tile pair (`attention_bwd_dq_ds_kernel`,
    by TMA: `tma_chunks`) instead of a dQ kernel that recomputes S and dP.

    The recomputed products cost 4 x d_work flops a score, the stored score 4 bytes of traffic (written, then read),
    whatever d: so where the tiles hold 128 columns or more, and the scores take at most SCORES_MAX_BYTES (memory
    stays O(N) past that). Timed on an H100 (docs/ops/attention.md, "Stored scores"), forward + backward over the
    recomputing backward's: 0.77-0.98x at d 112-160 (6 shapes within the budget; 1.01x at one past it), 0.92-1.07x
    at d 80-96, 0.94-1.15x at d <= 64."""
    if _FORCED_STORE:
        return _FORCED_STORE[-1]
    return d_work(d) >= 128 and heads * nk * nq * 2 <= SCORES_MAX_BYTES


def score_slices(d: int, z: int, hq: int, hkv: int, nq: int, nk: int, causal: bool) -> list[tuple[slice, slice]] | None:
    """Where the unmasked backward would store dS at tiles of more than 128 columns but the scores of all heads pass
    SCORES_MAX_BYTES, while those of one KV head's query heads fit: the (batch, KV head) slices, in order, that the
    backward runs one after another, each storing its own scores in the same workspace (memory stays within the
    budget). Whole batches at a time where a batch's heads fit, else one batch at a time in KV-head groups; the slices
    as even as the budget allows (16 heads of which 15 fit: 8 and 8, not 15 and 1). None: the backward runs whole.
    Tiles of 128 columns run whole (their dQ recomputing S and dP): sliced, each slice's grid is a fraction of the
    whole's, and at d 112-128 that cost more than the recomputation saved. Causal runs whole: sliced, it took 1.36x
    the whole's time at d 176 and 192 GQA (docs/ops/attention.md, "Scores past the budget")."""
    group = hq // hkv
    per_head = group * nq * nk * 2  # bytes of dS a KV head's query heads store
    if causal or d_work(d) <= 128 or z * hkv * per_head <= SCORES_MAX_BYTES or per_head > SCORES_MAX_BYTES:
        return None
    fit = SCORES_MAX_BYTES // per_head  # KV heads whose scores fit at once

    def even(n: int, most: int) -> list[slice]:  # [0, n) in the fewest slices of at most `most`, as even as can be
        size = -(-n // -(-n // most))
        return [slice(i, min(n, i + size)) for i in range(0, n, size)]

    if fit >= hkv:
        return [(b, slice(0, hkv)) for b in even(z, fit // hkv)]
    return [(slice(b, b + 1), h) for b in range(z) for h in even(hkv, fit)]


def _backward_by_slices(
    slices: list[tuple[slice, slice]],
    do4: torch.Tensor,
    q4: torch.Tensor,
    k4: torch.Tensor,
    v4: torch.Tensor,
    o4: torch.Tensor,
    lse4: torch.Tensor,
    dq: torch.Tensor,
    dk: torch.Tensor,
    dv: torch.Tensor,
    scale: float,
) -> bool:
    """The unmasked backward of (Z, H, N, d) tensors run slice by slice (`score_slices`), each slice's gradients
    copied into dq, dk, dv (contiguous). False, with nothing run, where a slice's views would not take TMA
    descriptors (their bases off 16 bytes): the whole backward then runs as before."""
    group = q4.shape[1] // k4.shape[1]
    heads = [(b, slice(h.start * group, h.stop * group), h) for b, h in slices]  # (batch, query heads, KV heads)
    if not all(tma_ready(q4[b, qh], k4[b, h], v4[b, h]) for b, qh, h in heads):
        return False
    for b, qh, h in heads:  # lse's slice made contiguous: the kernels read its rows in order
        grads = backward(do4[b, qh], q4[b, qh], k4[b, h], v4[b, h], o4[b, qh], lse4[b, qh].contiguous(), False, scale)
        dq[b, qh].copy_(grads[0])
        dk[b, h].copy_(grads[1])
        dv[b, h].copy_(grads[2])
    return True


def ds_plan(d: int, dtype: torch.dtype, nq: int, nk: int, heads: int, sms: int) -> Plan:
    """The plan of `attention_bwd_dq_ds_kernel`: 64 queries x 64 keys on 4 warps (8 past 256-byte rows: its fp32
    dQ tile), 3 stages; fitted to the shape. Forced as DQ_DS (`forced_plans`)."""
    if DQ_DS in FORCED:
        return FORCED[DQ_DS]
    if _interpreter_plans():
        return Plan(16, 16, 1, 1)
    row = d_work(d) * dtype.itemsize
    return fit_plan("dq", Plan(64, 64, 4 if row <= 256 else 8, 3), nq, nk, heads, sms, row)


ORDER_SHARE = 8  # in the causal kernels' order across heads, SMs a head's programs hold at once at least


def order_heads(sms: int, blocks: int) -> int:
    """Heads a group of the causal kernels' order across heads (`_program`) on a GPU of `sms` SMs, each head cut
    into `blocks` row blocks: sms over ORDER_SHARE, so that the programs running at once share each head's K/V (or
    Q/dO) reads among at least ORDER_SHARE of them, and at least 4 sms / (blocks + 1), so that a group's work (blocks
    (blocks + 1) / 2 block steps a head, over about 2 programs an SM) outlasts its longest program: the last group's
    would otherwise run on alone. At least 1 (head by head; 0 SMs: no GPU planned for)."""
    if sms == 0:
        return 1
    return max(1, sms // ORDER_SHARE, -(-4 * sms // (blocks + 1)))


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def tma_ready(*tensors: torch.Tensor) -> bool:
    """Whether the kernels read and write these tensors by TMA descriptors: 16-bit CUDA tensors on a Hopper or later
    GPU (not the interpreter; plain tensors, not a tracer's fakes), the head dim within two chunks of at most 128
    columns (`tma_chunks`: d <= 256), the last dim contiguous, and the base and every other stride 16-byte aligned
    (the copy engine's rules)."""
    t = tensors[0]
    if type(t) is not torch.Tensor or t.element_size() != 2 or max(tma_chunks(t.shape[-1])) > 128:
        return False
    gpu = _gpu(t.device)
    if gpu is None or gpu[2] < 9:
        return False
    return all(
        x.stride(-1) == 1 and x.data_ptr() % 16 == 0 and all(s > 0 and s * 2 % 16 == 0 for s in x.stride()[:-1])
        for x in tensors
    )


def query_splits(programs: int, nq: int, block_m: int, sms: int) -> int:
    """Into how many shares of the query blocks the dK/dV kernel splits each key block's loop: 1 while its grid
    (`programs` = key blocks x batch x key/value heads) gives every one of `sms` SMs a program; else enough shares
    to, each of at least two query blocks. Few keys (N_k of 1-100, decoding-like shapes) otherwise leave a handful of
    programs looping over every query."""
    if programs >= sms:
        return 1
    return max(1, min(triton.cdiv(sms, programs), triton.cdiv(nq, block_m) // 2))


def fit_plan(kernel: str, plan: Plan, nq: int, nk: int, heads: int, sms: int, row_bytes: int) -> Plan:
    """`plan` fitted to a shape of nq queries and nk keys over `heads` (batch x heads) programs' rows.

    No tile is longer than its sequence padded to a power of two (>= 16): at N = 3 a 128 x 64 tile multiplies 99.9%
    zeros. A tile so cut to a fraction of the plan's area keeps that fraction of its warps (at least 1; 2 past
    128-byte rows, 4 past 256: their accumulators' registers). Then, while the grid (cdiv(rows, block) x heads
    programs; the block along the keys for dkdv, the queries otherwise) would not give every SM one program, that
    block is halved, down to 32, and the other block cut to it where it is longer (the warps kept).
    """
    block_m = min(plan.block_m, d_pad(nq))
    block_n = min(plan.block_n, d_pad(nk))
    least = 4 if row_bytes > 256 else 2 if row_bytes > 128 else 1
    warps = max(min(least, plan.warps), plan.warps * block_m * block_n // (plan.block_m * plan.block_n))
    rows, major = (nk, block_n) if kernel == "dkdv" else (nq, block_m)
    while major > 32 and triton.cdiv(rows, major) * heads < sms:
        major //= 2
    if kernel == "dkdv" and major < block_n:
        block_m, block_n = min(block_m, major), major
    elif kernel != "dkdv" and major < block_m:
        block_m, block_n = major, min(block_n, major)
    return Plan(block_m, block_n, warps, plan.stages)


# ---------------------------------------------------------------------------------------------- launchers


def _launch(kernel: triton.JITFunction, grid: tuple[int], *args: object, plan: Plan, **constexprs: object) -> None:
    """Launch through fuselab.ops.library.wrap_triton, so torch.compile sees the kernel (a plain call in eager)."""
    wrap_triton(kernel)[grid](*args, **constexprs, num_warps=plan.warps, num_stages=plan.stages)


def seen_keys(nq: int, nk: int, causal: bool) -> int:
    """How many keys (from the first) some query sees: all nk, or under the top-left causal mask the first nq."""
    return min(nq, nk) if causal else nk


def as_4d(t: torch.Tensor) -> torch.Tensor:
    """(B, N, d) -> (B, 1, N, d) and (..., H, N, d) -> (Z, H, N, d), views where the strides allow."""
    if t.dim() == 3:
        return t.unsqueeze(1)
    return t if t.dim() == 4 else t.reshape(-1, *t.shape[-3:])


def output_like(q: torch.Tensor) -> torch.Tensor:
    """An empty tensor of q's shape and dtype, (B, H, N, d) laid out in memory in the order of q's strides (d
    innermost), as SDPA's kernels lay out O: where q is sliced from a (B, N, 3, H, d) projection, O's
    `transpose(1, 2).reshape(B, N, H * d)` is then a view, not a copy. Other ranks: contiguous."""
    if q.dim() != 4:
        return torch.empty(q.shape, dtype=q.dtype, device=q.device)
    order = sorted(range(3), key=lambda i: -q.stride(i))  # outermost first; ties (size-1 dims) keep their order
    return torch.empty_permuted(q.shape, (*order, 3), dtype=q.dtype, device=q.device)


def _precision(dtype: torch.dtype) -> str:
    """fp32 inputs are multiplied in full fp32 ("ieee"), not TF32; the setting is moot for 16-bit inputs."""
    return "ieee" if dtype == torch.float32 else "tf32"


def _descriptors(t: torch.Tensor, rows: int, da: int, db: int) -> tuple[TensorDescriptor, TensorDescriptor | None]:
    """TMA descriptors of the (Z, H, N, d) tensor `t` for tiles of `rows` rows: columns [0, da), then [da, da + db)
    (None when db = 0: a constexpr the kernel never reads, where a descriptor would cost the launch host time)."""
    shape, strides = list(t.shape), list(t.stride())
    first = _descriptor(t, shape, strides, [1, 1, rows, da])
    return first, _descriptor(t, shape, strides, [1, 1, rows, db]) if db else None


_DESCRIPTOR_FIELDS = ("base", "shape", "strides", "block_shape", "padding")
_UNCHECKED = tuple(f.name for f in fields(TensorDescriptor)) == _DESCRIPTOR_FIELDS


def _descriptor(t: torch.Tensor, shape: list[int], strides: list[int], block: list[int]) -> TensorDescriptor:
    """TensorDescriptor(t, shape, strides, block), without the checks of its __post_init__ where its fields are the
    ones known here: `tma_ready` made them (16-byte aligned base and strides, a unit last stride; a fresh contiguous
    copy of the gradient where it failed them; the callers launch only tensors of no empty dimension) and the plans'
    tiles are powers of two. The checks took 2 us of host time a descriptor, and a backward call makes up to 22."""
    if not _UNCHECKED:
        return TensorDescriptor(t, shape, strides, block)
    d = object.__new__(TensorDescriptor)
    d.base, d.shape, d.strides, d.block_shape, d.padding = t, shape, strides, block, "zero"
    return d


def forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """O (q's shape, laid out by `output_like`) and L (q's shape without d, fp32, natural log). Inputs checked by the
    caller."""
    q4, k4, v4 = as_4d(q), as_4d(k), as_4d(v)
    z, hq, nq, d = q4.shape
    hkv, nk = k4.shape[1], k4.shape[2]
    o = as_4d(output_like(q))
    lse = torch.empty((z, hq, nq), dtype=torch.float32, device=q.device)
    if o.numel() > 0:
        plan = choose_plan("fwd", d, q.dtype, causal, q.device, nq, nk, z * hq)
        gpu = _gpu(q.device)
        num_m = triton.cdiv(nq, plan.block_m)
        group = order_heads(gpu[1] if gpu is not None else 0, num_m)
        if tma_ready(q4, k4, v4, o):
            da, db = tma_chunks(d)
            plan = tma_forward_plan(plan, db)
            _launch(
                attention_fwd_tma_kernel, (num_m * z * hq,), *_descriptors(q4, plan.block_m, da, db),
                *_descriptors(k4, plan.block_n, da, db), *_descriptors(v4, plan.block_n, da, db),
                *_descriptors(o, plan.block_m, da, db), lse, hq, hq // hkv, nq, nk, num_m, group, scale * LOG2E,
                plan=plan, DA=da, DB=db, BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, CAUSAL=causal,
                PREC=_precision(q.dtype),
            )  # fmt: skip
            return o.reshape(q.shape), lse.reshape(q.shape[:-1])
        _launch(
            attention_fwd_kernel, (num_m * z * hq,), q4, k4, v4, o, lse,
            *q4.stride(), *k4.stride(), *v4.stride(), *o.stride(), hq, hq // hkv, nq, nk, num_m, group,
            scale * LOG2E, plan=plan, HEAD_DIM=d, ALIGN=row_align(q4, k4, v4, o), DA=d_chunks(d)[0],
            DB=d_chunks(d)[1], BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, CAUSAL=causal, PREC=_precision(q.dtype),
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
        # descriptors: for the TMA kernels where they hold the head dim as the pointer ones do (d <= 192; heads of
        # 193-256 take the pointer kernels), for the stored scores and their dQ kernel (`tma_chunks`) wherever ready
        descriptors = tma_ready(q4, k4, v4, dq, dk, dv)
        slices = score_slices(d, z, hq, hkv, nq, nk, causal) if descriptors and not _FORCED_STORE else None
        lse4 = lse.reshape(z, hq, nq)
        if slices and _backward_by_slices(slices, do4, q4, k4, v4, o4, lse4, dq, dk, dv, scale):
            return dq.reshape(q.shape), dk.reshape(k.shape), dv.reshape(v.shape)
        tma = descriptors and tma_chunks(d) == d_chunks(d)
        if tma and not tma_ready(do4):  # a strided or misaligned gradient: one aligned copy, every tile by TMA
            do4 = do4.clone(memory_format=torch.contiguous_format)
        delta = launcher.workspace("attention delta", z * hq * nq, torch.float32, q.device, zeros=False)
        small = _interpreter_plans()
        prec = _precision(q.dtype)
        da, db = d_chunks(d)
        # fitted to the keys some query sees: 12 causal queries over 9243 keys are one block of 16 keys, not 64
        plan = choose_plan("dkdv", d, q.dtype, causal, q.device, nq, seen_keys(nq, nk, causal), z * hkv)
        num = triton.cdiv(seen_keys(nq, nk, causal), plan.block_n)
        seen = min(nk, num * plan.block_n)
        if seen < nk:  # keys no query sees (top-left causal, nk > nq): their dK and dV are zeros
            rows, block = z * hkv * (nk - seen), 16 if small else 64
            _launch(
                attention_bwd_unseen_kernel, (triton.cdiv(rows, block),), dk, dv, rows, nk, seen,
                plan=Plan(block, block, 1 if small else 4, 1), HEAD_DIM=d, D_PAD=d_pad(d), BLOCK_R=block,
            )  # fmt: skip
        # One key block holds every key a query sees (short or few keys): each query block's dQ has one term, which
        # the dK/dV kernel writes (by pointers), so the dQ kernel and its recomputed products are not needed.
        one_block = num == 1
        if one_block:
            plan = replace(plan, block_m=min(plan.block_m, dq_tile_rows(d, plan.warps)))
        gpu = _gpu(q.device)
        sms = gpu[1] if gpu is not None else 0
        splits = query_splits(num * z * hkv, nq, plan.block_m, sms)
        store_ds = descriptors and not one_block and stores_scores(d, z * hq, nq, nk)
        write_delta = not one_block and not store_ds and delta_in_dq(q.dtype)
        if write_delta:  # the dQ kernel that recomputes S and dP runs first and writes delta for the dK/dV kernel
            _backward_dq(q4, k4, v4, do4, o4, lse4, delta, dq, causal, scale, tma, sms, True)
        else:  # the dK/dV kernel runs first: delta of its own kernel
            _backward_delta(o4, do4, delta, causal, nk, small, like_dq=store_ds)
        ds = ds_out = None
        if store_ds:  # dS^T of each query head: its keys' rows, its queries' columns (rounded up to 16 bytes)
            nq8 = triton.cdiv(nq, 8) * 8
            ds = launcher.workspace("attention scores", z * hq * nk * nq8, q.dtype, q.device, zeros=False)
            ds = ds.view(z * hq, nk, nq8)
            ds_out = _descriptor(ds, list(ds.shape), list(ds.stride()), [1, plan.block_n, plan.block_m])
        dkp = dvp = None
        if splits > 1:  # unscaled fp32 partials of each share of the queries, summed below
            part = z * hkv * nk * (da + db)
            dkp = launcher.workspace("attention dk partials", splits * part, torch.float32, q.device, zeros=False)
            dvp = launcher.workspace("attention dv partials", splits * part, torch.float32, q.device, zeros=False)
        grid = (num * z * hkv, splits)
        if tma and not one_block:
            out = [None] * 4  # the partials are written by pointers
            if splits == 1:
                out = [*_descriptors(dk, plan.block_n, da, db), *_descriptors(dv, plan.block_n, da, db)]
            _launch(
                attention_bwd_dkdv_tma_kernel, grid, *_descriptors(q4, plan.block_m, da, db),
                *_descriptors(k4, plan.block_n, da, db), *_descriptors(v4, plan.block_n, da, db),
                *_descriptors(do4, plan.block_m, da, db), lse4, delta, *out, dkp, dvp, ds_out,
                hkv, hq // hkv, nq, nk, num, order_heads(sms, num), scale * LOG2E, scale,
                plan=plan, DA=da, DB=db, BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, CAUSAL=causal,
                QSPLIT=splits > 1, STORE_DS=store_ds, PREC=prec,
            )  # fmt: skip
        else:
            _launch(
                attention_bwd_dkdv_kernel, grid, q4, k4, v4, do4, lse4, delta, dk, dv,
                *q4.stride(), *k4.stride(), *v4.stride(), *do4.stride(), *dk.stride(), *dv.stride(), dkp, dvp,
                dq, *dq.stride(), ds_out, hkv, hq // hkv, nq, nk, num, order_heads(sms, num), scale * LOG2E, scale,
                plan=plan, HEAD_DIM=d, ALIGN=row_align(q4, k4, v4, do4, dk, dv, dq), DA=da, DB=db,
                BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, CAUSAL=causal, QSPLIT=splits > 1, PREC=prec,
                WRITE_DQ=one_block, STORE_DS=store_ds,
            )  # fmt: skip
        if splits > 1:  # a sum in a fixed order: deterministic
            rows, block = z * hkv * nk, 16  # 16 rows of fp32 dK and dV a program: 64 spilled its pointers
            _launch(
                attention_bwd_sum_kernel, (triton.cdiv(rows, block),), dkp, dvp, dk, dv, rows, nk, seen, splits, part,
                scale, plan=Plan(block, block, 1 if small else 4, 1), HEAD_DIM=d, WIDTH=da + db, D_PAD=d_pad(d),
                BLOCK_R=block,
            )  # fmt: skip
        if one_block:
            return dq.reshape(q.shape), dk.reshape(k.shape), dv.reshape(v.shape)
        if ds is not None:  # dQ = dS K from the stored dS: one product a tile pair
            plan = ds_plan(d, q.dtype, nq, nk, z * hq, sms)
            num = triton.cdiv(nq, plan.block_m)
            ta, tb = tma_chunks(d)
            _launch(
                attention_bwd_dq_ds_kernel, (num * z * hq,),
                _descriptor(ds, list(ds.shape), list(ds.stride()), [1, plan.block_n, plan.block_m]),
                *_descriptors(k4, plan.block_n, ta, tb), *_descriptors(dq, plan.block_m, ta, tb),
                hq, hq // hkv, nq, nk, num, order_heads(sms, num), scale,
                plan=plan, DA=ta, DB=tb, BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, CAUSAL=causal, PREC=prec,
            )  # fmt: skip
        elif not write_delta:
            _backward_dq(q4, k4, v4, do4, o4, lse4, delta, dq, causal, scale, tma, sms, False)
    return dq.reshape(q.shape), dk.reshape(k.shape), dv.reshape(v.shape)


def _backward_delta(
    o4: torch.Tensor, do4: torch.Tensor, delta: torch.Tensor, causal: bool, nk: int, small: bool, like_dq: bool
) -> None:
    """Launch the delta kernel: delta (z * hq * nq fp32) = rowsum(O * dO) of o4 and do4 (Z, HQ, NQ, d). `like_dq`
    (the scores stored, TMA only): on the rows and warps of the dQ kernel that writes delta on the pointer path
    (`delta_in_dq`), so that it sums as that kernel does and both paths give the same gradients. Else 64 rows on 4
    warps, or where the queries are fewer, their count rounded up to a power of 2 (16 at least) on 2 warps: 64 rows
    over 3 queries read mostly masked lanes, and the dQ kernel's 128 rows on 2 warps left 6661 queries of 8 heads in
    a quarter of a wave (docs/ops/attention.md, session 65)."""
    z, hq, nq, d = o4.shape
    rows = min(64, d_pad(nq))
    plan = Plan(16, 1, 1, 1) if small else Plan(rows, 1, 4 if rows == 64 else 2, 1)
    if like_dq and delta_in_dq(o4.dtype):
        dq = choose_plan("dq", d, o4.dtype, causal, o4.device, nq, nk, z * hq)
        plan = Plan(dq.block_m, 1, dq.warps, 1)
    num = triton.cdiv(nq, plan.block_m)
    da, db = d_chunks(d)
    _launch(
        attention_bwd_delta_kernel, (num * z * hq,), o4, do4, delta, *o4.stride(), *do4.stride(), hq, nq, num,
        plan=plan, HEAD_DIM=d, ALIGN=row_align(o4, do4), DA=da, DB=db, BLOCK_M=plan.block_m,
    )  # fmt: skip


def _backward_dq(
    q4: torch.Tensor,
    k4: torch.Tensor,
    v4: torch.Tensor,
    do4: torch.Tensor,
    o4: torch.Tensor,
    lse4: torch.Tensor,
    delta: torch.Tensor,
    dq: torch.Tensor,
    causal: bool,
    scale: float,
    tma: bool,
    sms: int,
    write_delta: bool,
) -> None:
    """Launch the dQ kernel that recomputes S and dP (by TMA where `tma`), which also writes delta (z * hq * nq
    fp32) for the dK/dV kernel where `write_delta`, and reads it if not. Tensors (Z, H, N, d); dq (Z, HQ, NQ, d) is
    written."""
    z, hq, nq, d = q4.shape
    hkv, nk = k4.shape[1], k4.shape[2]
    da, db = d_chunks(d)
    plan = choose_plan("dq", d, q4.dtype, causal, q4.device, nq, nk, z * hq)
    num = triton.cdiv(nq, plan.block_m)
    if tma:
        _launch(
            attention_bwd_dq_tma_kernel, (num * z * hq,), *_descriptors(q4, plan.block_m, da, db),
            *_descriptors(k4, plan.block_n, da, db), *_descriptors(v4, plan.block_n, da, db),
            *_descriptors(do4, plan.block_m, da, db), lse4, delta, o4, *o4.stride(), do4, *do4.stride(),
            *_descriptors(dq, plan.block_m, da, db), hq, hq // hkv, nq, nk, num, order_heads(sms, num),
            scale * LOG2E, scale, plan=plan, HEAD_DIM=d, ALIGN=row_align(o4, do4), DA=da, DB=db,
            BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, CAUSAL=causal, PREC=_precision(q4.dtype),
            WRITE_DELTA=write_delta,
        )  # fmt: skip
    else:
        _launch(
            attention_bwd_dq_kernel, (num * z * hq,), q4, k4, v4, do4, lse4, delta, o4, dq,
            *q4.stride(), *k4.stride(), *v4.stride(), *do4.stride(), *o4.stride(), *dq.stride(),
            hq, hq // hkv, nq, nk, num, order_heads(sms, num), scale * LOG2E, scale,
            plan=plan, HEAD_DIM=d, ALIGN=row_align(q4, k4, v4, do4, o4, dq), DA=da, DB=db, BLOCK_M=plan.block_m,
            BLOCK_N=plan.block_n, CAUSAL=causal, PREC=_precision(q4.dtype), WRITE_DELTA=write_delta,
        )  # fmt: skip
