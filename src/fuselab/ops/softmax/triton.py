"""Softmax over the last dimension in Triton: five forward kernels chosen by row width, two backward kernels.

The input is seen as (rows, width) with unit stride along the width (see `_shared.as_rows`); each kernel takes row
strides, so sliced rows need no copy. Row offsets are int64 (rows * stride passes 2^31 at 256 MiB sizes). Math is in
fp32 whatever the storage dtype; the max is subtracted before exp, so 1e30 does not overflow, -inf entries give 0, and
a row that is all -inf (or holds +inf or NaN) gives NaN, as torch.softmax does.

Which kernel (`forward_plan`, thresholds below; docs/ops/softmax.md explains them):

- width <= ROW_MAX (32768 columns): `_forward_rows_kernel`, rows held whole in registers, read once and written once.
  Short rows go several to a program (a [ROWS, BLOCK] tile of about TILE_BYTES); from 1024 fp32 columns it is one
  row per program, the lecture's kernel. In fp32 and for held rows, masks are compiled out where the tile divides the
  tensor (EVEN); at some widths registers are capped so one more program fits on an SM (MAXNREG). Wide bf16 rows
  (HELD_BF16) stay in bf16 between the passes, converted for each and exp computed twice: half the registers, so
  twice the programs.
  Where one row fills an SM's registers (fp16 rows of 32768, AHEAD), `_forward_rows_ahead_kernel`: the same, but
  persistent (one program per SM), each program loading its next row while it computes this one.
  On a GPU, exp is one ex2.approx.ftz (`_exp`). Widths and strides that are multiples of a 16-byte vector but not of
  16 elements are declared so (`_alignment`; all kernels but the split ones): Triton would otherwise read such rows a
  few bytes at a time.
- wider, on a GPU, up to one chunk per SM: a row is cut into chunks, one program each; every program keeps its chunk
  in registers, publishes its (max, sum of exp) to global memory, waits for the other chunks of its row, and writes
  its chunk: the row is still read once and written once. `_forward_split_kernel` in general;
  `_forward_split_pairs_kernel` for bf16 rows of even width, which holds two bf16 in each 32-bit register (half the
  registers of fp32 values, so twice the programs per SM).
- otherwise (wider still, or under the CPU interpreter, which runs programs one after another and so cannot wait):
  `_forward_looped_kernel`, an online softmax: one pass for max and sum together, one pass to write (reads 2x).
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from fuselab.ops.backends import triton_unavailable
from fuselab.ops.library import define_op, on_device, wrap_triton
from fuselab.ops.softmax import _shared
from fuselab.ops.softmax.spec import SOFTMAX

# Thresholds timed on the H200 (copy ceiling ~4270 GB/s) with tune.py and the exploration of 2026-11-29/30
# (2^26-element tensors; benchmarks/results/h200/logs/), all with the timer's former L2 flush, which wrote a buffer:
# at these sizes its GB/s are some 5% below today's, but each comparison was timed side by side. A row held whole by
# one program: up to ROW_MAX columns. fp32 rows of 32768 moved 3915-3945 GB/s this way (split: 3142-3336); bf16 rows
# of 65536 are faster split in pairs (2792-2818 GB/s against 2190-2736 whole, where ptxas spills).
ROW_MAX = 32768
# Backward holds y and dy, so fewer.
BACKWARD_ROW_MAX = 8192
# Short rows go several to a program, so each program moves about TILE_BYTES: 4 KiB tiles moved 4068-4150 GB/s in
# fp32 and 3929-3985 in bf16 at widths 128-1024; 8 KiB tiles 3972-4080 and 3718-3885. Warps for such a tile, by
# element size: fp32 1 warp (32 values per thread) 4112-4150 GB/s (2 warps 4068-4146, 4 warps 4097-4134); bf16
# 4 warps 3929-3985 (2 warps 3902-3961).
TILE_BYTES = 4096
SHORT_WARPS = {4: 1, 2: 4}
# (columns, warps) per program in the split kernels, by element size; bf16 pairs apart. fp32: 16384 columns at 16
# warps moved 3184-3307 GB/s at widths 65536-262144 (8192: 3023-3134). 16 bits, one by one (timed in bf16): 8192 at
# 8 warps 2453-2639 (16 warps: 2245-2429). bf16 in pairs: 8192 at 4 warps 2583-2818 (8 warps: 2357-2511; 16384
# columns: 1989-2333).
SPLIT = {4: (16384, 16), 2: (8192, 8)}
SPLIT_PAIRS = (8192, 4)
LOOP_BLOCK = 4096
# Rows whose tile fills an SM's registers, by element size: from this padded width, the rows kernel runs persistent and
# one tile ahead (`_forward_rows_ahead_kernel`, one program per SM) with these warps. bf16 rows of 32768: 3417-3458
# GB/s against 3058-3072 for the rows kernel (fp16: 3187-3196 against 3013-3086); at 16384 it was slower (2808-3547
# against 3682-3699), and in fp32 too (2597-3832 against 3934-4036). Now for fp16 only: bf16 rows are held instead
# (HELD_BF16, checked first). fp16 32768 with the fast exp: 3324 GB/s against 3245 with tl.exp, though ptxas then
# spills 4 bytes (softmax_explore_9).
AHEAD = {2: (32768, 32)}
# Register caps for the forward rows kernel (ptxas maxnreg), by (element size, padded width), so one more program fits
# on an SM. bf16 16384 at 16 warps: 51 -> 40 registers, 3 programs per SM instead of 2, 3860-3882 GB/s against
# 3674-3694 (36 or 32 spill: 1633-2251). bf16 512, 4 rows at 4 warps: 37 -> 32, 16 programs instead of 13, 3945
# against 3924-3927. Other caps tried were no faster (benchmarks/results/h200/logs/softmax_explore_6.log). fp16 is
# given bf16's caps untimed; bf16 16384 is held now (HELD_BF16, its own cap). Not for the backward kernel, which holds
# two tensors.
MAXNREG = {(2, 16384): 40, (2, 512): 32}
# bf16 rows held in bf16 between the passes (`Plan.hold`), by padded width: (warps, maxnreg). Timed with the reading
# flush (softmax_explore_7/9), exp as ex2.approx.ftz: rows of 32768 at 32 warps need 32 registers, so two programs fit
# on an SM: 3964-3966 GB/s against 3718 for rows_ahead (24000 columns: 3697 against 3426); 16384 at 16 warps capped
# at 40: 4104 against 3953-4060 unheld. Not fp16: with no bit-shift spelling its held rows took 48 registers at
# 32768 and moved 3171 GB/s against 3324 for rows_ahead.
HELD_BF16 = {32768: (32, None), 16384: (16, 40)}


@triton.jit
def _exp(x, PTX: tl.constexpr):
    """exp of fp32 x. PTX: one ex2.approx.ftz (a single MUFU.EX2; tl.exp's ex2.approx also compares and scales twice
    for subnormals, which a softmax does not need: results below 2^-126 become 0). PTX False: tl.exp.
    On the H200 (softmax_explore_9) it moved 1-3% more at bf16 128-8192 and fp32 4096-32768, a tie at fp32 128-1024,
    and 45% more with held rows (3966 GB/s against 2734 at bf16 32768)."""
    if PTX:
        return tl.inline_asm_elementwise(
            "ex2.approx.ftz.f32 $0, $1;", "=r,r", [x * 1.4426950408889634], dtype=tl.float32, is_pure=True, pack=1
        )
    else:
        return tl.exp(x)


@triton.jit
def _held_as_fp32(x, SPELLING: tl.constexpr, PTX: tl.constexpr):
    """16-bit x as fp32, spelled one of three ways the compiler does not merge into one (see _softmax_of_rows):
    .to; a bit shift (bf16; fp16: PTX); PTX cvt, not pure. PTX False (the interpreter): .to for the last two."""
    if SPELLING == 1 and x.dtype == tl.bfloat16:
        return (x.to(tl.int16, bitcast=True).to(tl.int32) << 16).to(tl.float32, bitcast=True)
    elif SPELLING == 0 or not PTX:
        return x.to(tl.float32)
    else:
        return tl.inline_asm_elementwise(
            "cvt.f32.bf16 $0, $1;" if x.dtype == tl.bfloat16 else "cvt.f32.f16 $0, $1;",
            "=r,h",
            [x],
            dtype=tl.float32,
            is_pure=False,
            pack=1,
        )


@triton.jit
def _softmax_of_rows(x, HOLD: tl.constexpr, PTX: tl.constexpr):
    """softmax along axis 1 of a [ROWS, BLOCK] tile, in fp32.

    HOLD (16-bit x): x stays in its storage type between the passes, converted to fp32 for each (max, sum of exp,
    output, exp computed twice), so only the 16-bit values are live across the two reductions: half the registers.
    Spelled alike, the three conversions would be merged into one whose fp32 values stay live. PTX: fast exp.
    """
    if HOLD:
        row_max = tl.max(_held_as_fp32(x, 0, PTX), axis=1, keep_dims=True)
        total = tl.sum(_exp(_held_as_fp32(x, 1, PTX) - row_max, PTX), axis=1, keep_dims=True)
        y = _exp(_held_as_fp32(x, 2, PTX) - row_max, PTX) * (1.0 / total)
    else:
        x = x.to(tl.float32)
        e = _exp(x - tl.max(x, axis=1, keep_dims=True), PTX)
        y = e * (1.0 / tl.sum(e, axis=1, keep_dims=True))
    return y


@triton.jit
def _forward_rows_kernel(
    x_ptr,
    y_ptr,
    n_rows,
    n_cols,
    x_row_stride,
    y_row_stride,
    ROWS: tl.constexpr,
    BLOCK: tl.constexpr,
    EVEN: tl.constexpr,
    HOLD: tl.constexpr,
    PTX: tl.constexpr,
    ALIGN: tl.constexpr,
):
    """ROWS whole rows per program. x, y: (n_rows, n_cols), unit column stride; BLOCK >= n_cols, a power of 2.

    EVEN (n_cols == BLOCK and ROWS divides n_rows): no masks. Otherwise rows past the end read the last row again
    (no NaN from empty rows) and are not stored. HOLD, PTX: see _softmax_of_rows. n_cols and the row strides come
    divided by ALIGN (see `_alignment`).
    """
    n_cols = n_cols * ALIGN  # at most 32768: no overflow; row offsets below are int64 before they are scaled
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)[:, None]
    cols = tl.arange(0, BLOCK)[None, :]
    if EVEN:
        x = tl.load(x_ptr + rows * x_row_stride * ALIGN + cols)
    else:
        x_rows = x_ptr + tl.minimum(rows, n_rows - 1) * x_row_stride * ALIGN
        x = tl.load(x_rows + cols, mask=cols < n_cols, other=float("-inf"))
    y = _softmax_of_rows(x, HOLD, PTX).to(y_ptr.dtype.element_ty)
    if EVEN:
        tl.store(y_ptr + rows * y_row_stride * ALIGN + cols, y)
    else:
        tl.store(y_ptr + rows * y_row_stride * ALIGN + cols, y, mask=(rows < n_rows) & (cols < n_cols))


@triton.jit
def _forward_rows_ahead_kernel(
    x_ptr,
    y_ptr,
    n_rows,
    n_cols,
    x_row_stride,
    y_row_stride,
    ROWS: tl.constexpr,
    BLOCK: tl.constexpr,
    PTX: tl.constexpr,
    ALIGN: tl.constexpr,
):
    """The rows kernel, persistent and one tile ahead: program p of P takes the tiles p, p + P, ... and loads its
    next tile before the math of this one, so its loads are in flight while it computes. For rows so wide that one
    program fills an SM's registers. Rows past the end are masked (read as -inf, not stored). n_cols and the row
    strides come divided by ALIGN (see `_alignment`)."""
    n_cols = n_cols * ALIGN  # as in _forward_rows_kernel
    step = tl.num_programs(0) * ROWS
    start = tl.program_id(0).to(tl.int64) * ROWS
    rows = start + tl.arange(0, ROWS)[:, None]
    cols = tl.arange(0, BLOCK)[None, :]
    ahead = tl.load(
        x_ptr + rows * x_row_stride * ALIGN + cols, mask=(rows < n_rows) & (cols < n_cols), other=float("-inf")
    )
    # `while`, not `for`: Triton 3.6's interpreter cannot run `for` to a runtime bound (see _forward_looped_kernel).
    while start < n_rows:
        x = ahead
        after = rows + step
        ahead = tl.load(
            x_ptr + after * x_row_stride * ALIGN + cols, mask=(after < n_rows) & (cols < n_cols), other=float("-inf")
        )
        y = _softmax_of_rows(x, False, PTX).to(y_ptr.dtype.element_ty)
        tl.store(y_ptr + rows * y_row_stride * ALIGN + cols, y, mask=(rows < n_rows) & (cols < n_cols))
        rows = after
        start += step


@triton.jit
def _row_of_ticket(sync_ptr, SPLIT: tl.constexpr):
    """(ticket, row, chunk) for a program of a split kernel: its work, in the order programs start running."""
    ticket = tl.atomic_add(sync_ptr, 1).to(tl.int64)
    return ticket, ticket // SPLIT, ticket % SPLIT


@triton.jit
def _row_max_and_inv_sum(
    max_ptr, sum_ptr, sync_ptr, ticket, row, chunk_max, chunk_sum, SPLIT: tl.constexpr, SPLIT_P2: tl.constexpr
):
    """Publish this chunk's (max, sum of exp(x - max)), wait for the row's other chunks, return the row's max and
    1 / sum of exp(x - row max). chunk_sum is taken with a shift of 0 where chunk_max is -inf (an all -inf chunk)."""
    tl.store(max_ptr + ticket, chunk_max)
    tl.store(sum_ptr + ticket, chunk_sum)
    tl.debug_barrier()  # every thread's stores precede the release below
    arrived = sync_ptr + 1 + row
    tl.atomic_add(arrived, 1, sem="release")
    while tl.atomic_add(arrived, 0, sem="acquire") < SPLIT:
        pass
    tl.debug_barrier()
    parts = tl.arange(0, SPLIT_P2)
    maxes = tl.load(max_ptr + row * SPLIT + parts, mask=parts < SPLIT, other=float("-inf"), cache_modifier=".cg")
    sums = tl.load(sum_ptr + row * SPLIT + parts, mask=parts < SPLIT, other=0.0, cache_modifier=".cg")
    row_max = tl.max(maxes, axis=0)
    return row_max, 1.0 / tl.sum(sums * tl.exp(maxes - row_max), axis=0)


@triton.jit
def _forward_split_kernel(
    x_ptr,
    y_ptr,
    max_ptr,
    sum_ptr,
    sync_ptr,
    n_cols,
    x_row_stride,
    y_row_stride,
    SPLIT: tl.constexpr,
    SPLIT_P2: tl.constexpr,
    CHUNK: tl.constexpr,
    PTX: tl.constexpr,
):
    """One CHUNK of one row per program, SPLIT programs per row (grid n_rows * SPLIT); GPU only.

    max_ptr, sum_ptr: (n_rows * SPLIT,) fp32 scratch. sync_ptr: (1 + n_rows,) int32 zeros; [0] hands out tickets,
    [1 + row] counts the chunks of a row that have published their (max, sum). Waiting for the rest of a row cannot
    deadlock: a program's work is its ticket, taken when it starts running, so the tickets taken are 0..T-1; every row
    but the last one begun has all its programs running, finishes, and frees room for the next tickets. It needs
    SPLIT programs to fit on the GPU at once: the caller keeps SPLIT <= the number of SMs. PTX: fast exp (`_exp`).
    """
    ticket, row, chunk = _row_of_ticket(sync_ptr, SPLIT)
    cols = chunk * CHUNK + tl.arange(0, CHUNK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=float("-inf")).to(tl.float32)
    chunk_max = tl.max(x, axis=0)
    shift = tl.where(chunk_max == float("-inf"), 0.0, chunk_max)  # an all -inf chunk has sum 0, not NaN
    chunk_sum = tl.sum(_exp(x - shift, PTX), axis=0)
    row_max, inv_sum = _row_max_and_inv_sum(
        max_ptr, sum_ptr, sync_ptr, ticket, row, chunk_max, chunk_sum, SPLIT, SPLIT_P2
    )
    y = _exp(x - row_max, PTX) * inv_sum
    tl.store(y_ptr + row * y_row_stride + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


NEG_INF_PAIR = tl.constexpr(-8323200)  # int32 0xFF80FF80: two bf16 -inf


@triton.jit
def _unpack_bf16_pairs(pairs, SPELLING: tl.constexpr, PTX: tl.constexpr):
    """int32 pairs of bf16 (the first element in the low half) -> (first, second) as fp32, spelled one of three ways.

    The split-pairs kernel unpacks its chunk three times (max, sum, output) so that only the packed int32 stay live
    in between. Written the same way each time, the compiler would reuse the first unpack's fp32 values and keep them
    instead (twice the registers); a shift, a conversion and inline PTX are three spellings it does not merge.
    PTX False (the interpreter has no inline PTX): the third is the second again.
    """
    if SPELLING == 0:
        return (pairs << 16).to(tl.float32, bitcast=True), (pairs & -65536).to(tl.float32, bitcast=True)
    elif SPELLING == 1 or not PTX:
        first = pairs.to(tl.int16).to(tl.bfloat16, bitcast=True).to(tl.float32)
        return first, (pairs >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True).to(tl.float32)
    else:
        return tl.inline_asm_elementwise(
            "{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $2; cvt.f32.bf16 $0, lo; cvt.f32.bf16 $1, hi; }",
            "=r,=r,r",
            [pairs],
            dtype=(tl.float32, tl.float32),
            is_pure=False,
            pack=1,
        )


@triton.jit
def _pack_bf16_pairs(first, second):
    """fp32 (first, second) -> int32 pairs of bf16, rounded to nearest even as .to(bfloat16) does."""
    low = first.to(tl.bfloat16).to(tl.int16, bitcast=True).to(tl.int32) & 65535
    return (second.to(tl.bfloat16).to(tl.int16, bitcast=True).to(tl.int32) << 16) | low


@triton.jit
def _forward_split_pairs_kernel(
    x_ptr,
    y_ptr,
    max_ptr,
    sum_ptr,
    sync_ptr,
    n_pairs,
    x_row_stride,
    y_row_stride,
    SPLIT: tl.constexpr,
    SPLIT_P2: tl.constexpr,
    CHUNK: tl.constexpr,
    PTX: tl.constexpr,
):
    """_forward_split_kernel for bf16 rows of even width, read and held as int32 pairs: one register per two columns.

    x_ptr, y_ptr: bf16, 4-byte aligned; rows of 2 * n_pairs columns; row strides and CHUNK counted in pairs.
    PTX: inline PTX allowed (not under the interpreter).
    """
    ticket, row, chunk = _row_of_ticket(sync_ptr, SPLIT)
    cols = chunk * CHUNK + tl.arange(0, CHUNK)
    mask = cols < n_pairs
    x_pairs = x_ptr.to(tl.pointer_type(tl.int32)) + row * x_row_stride
    pairs = tl.load(x_pairs + cols, mask=mask, other=NEG_INF_PAIR)
    first, second = _unpack_bf16_pairs(pairs, 0, PTX)
    chunk_max = tl.maximum(tl.max(first, axis=0), tl.max(second, axis=0))
    shift = tl.where(chunk_max == float("-inf"), 0.0, chunk_max)  # an all -inf chunk has sum 0, not NaN
    first, second = _unpack_bf16_pairs(pairs, 1, PTX)
    chunk_sum = tl.sum(_exp(first - shift, PTX), axis=0) + tl.sum(_exp(second - shift, PTX), axis=0)
    row_max, inv_sum = _row_max_and_inv_sum(
        max_ptr, sum_ptr, sync_ptr, ticket, row, chunk_max, chunk_sum, SPLIT, SPLIT_P2
    )
    first, second = _unpack_bf16_pairs(pairs, 2, PTX)
    y = _pack_bf16_pairs(_exp(first - row_max, PTX) * inv_sum, _exp(second - row_max, PTX) * inv_sum)
    tl.store(y_ptr.to(tl.pointer_type(tl.int32)) + row * y_row_stride + cols, y, mask=mask)


@triton.jit
def _forward_looped_kernel(
    x_ptr, y_ptr, n_cols, x_row_stride, y_row_stride, BLOCK: tl.constexpr, PTX: tl.constexpr, ALIGN: tl.constexpr
):
    """One row per program in steps of BLOCK columns: online max and sum, then a second pass writes y. PTX: fast
    exp (`_exp`). n_cols and the row strides come divided by ALIGN (see `_alignment`)."""
    n_cols = n_cols * ALIGN  # ALIGN is 1 from 2^31 columns, so this never overflows
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_row_stride * ALIGN
    y_row = y_ptr + row * y_row_stride * ALIGN
    cols = tl.arange(0, BLOCK)
    m = tl.full([BLOCK], float("-inf"), tl.float32)  # per lane: running max, and sum of exp(x - m)
    s = tl.zeros([BLOCK], tl.float32)
    # `while`, not `for ... in tl.range(n_cols)`: Triton 3.6's interpreter cannot take a runtime bound there with
    # numpy >= 2.4 (triton-lang/triton#9171). int64 columns: a row may pass 2^31 elements.
    start = tl.full((), 0, tl.int64)
    while start < n_cols:
        start = tl.multiple_of(start, BLOCK)  # lost on a `while` variable; without it no 16-byte loads
        x = tl.load(x_row + start + cols, mask=start + cols < n_cols, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, x)
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)  # a lane that saw only -inf keeps s = 0, not NaN
        s = s * _exp(m - shift, PTX) + _exp(x - shift, PTX)
        m = m_new
        start += BLOCK
    row_max = tl.max(m, axis=0)
    inv_sum = 1.0 / tl.sum(s * tl.exp(m - row_max), axis=0)
    # Write from the end back: the end of the row was read last and is the likeliest still in L2.
    start -= BLOCK
    while start >= 0:
        start = tl.multiple_of(start, BLOCK)
        mask = start + cols < n_cols
        x = tl.load(x_row + start + cols, mask=mask, other=float("-inf")).to(tl.float32)
        tl.store(y_row + start + cols, (_exp(x - row_max, PTX) * inv_sum).to(y_ptr.dtype.element_ty), mask=mask)
        start -= BLOCK


@triton.jit
def _backward_rows_kernel(
    y_ptr,
    dy_ptr,
    dx_ptr,
    n_rows,
    n_cols,
    y_row_stride,
    dy_row_stride,
    dx_row_stride,
    ROWS: tl.constexpr,
    BLOCK: tl.constexpr,
    ALIGN: tl.constexpr,
):
    """dx = y * (dy - sum(dy * y)) for ROWS whole rows per program; all (n_rows, n_cols), unit column stride.
    n_cols and the row strides come divided by ALIGN (see `_alignment`)."""
    n_cols = n_cols * ALIGN  # as in _forward_rows_kernel
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)[:, None]
    cols = tl.arange(0, BLOCK)[None, :]
    src = tl.minimum(rows, n_rows - 1)  # rows past the end read the last row again and are not stored
    y = tl.load(y_ptr + src * y_row_stride * ALIGN + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + src * dy_row_stride * ALIGN + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
    dx = y * (dy - tl.sum(y * dy, axis=1, keep_dims=True))
    tl.store(
        dx_ptr + rows * dx_row_stride * ALIGN + cols,
        dx.to(dx_ptr.dtype.element_ty),
        mask=(rows < n_rows) & (cols < n_cols),
    )


@triton.jit
def _backward_looped_kernel(
    y_ptr, dy_ptr, dx_ptr, n_cols, y_row_stride, dy_row_stride, dx_row_stride, BLOCK: tl.constexpr, ALIGN: tl.constexpr
):
    """dx = y * (dy - sum(dy * y)), one row per program in steps of BLOCK: a pass for the sum, a pass for dx.
    n_cols and the row strides come divided by ALIGN (see `_alignment`)."""
    n_cols = n_cols * ALIGN  # as in _forward_looped_kernel
    row = tl.program_id(0).to(tl.int64)
    y_row = y_ptr + row * y_row_stride * ALIGN
    dy_row = dy_ptr + row * dy_row_stride * ALIGN
    dx_row = dx_ptr + row * dx_row_stride * ALIGN
    cols = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    start = tl.full((), 0, tl.int64)  # `while`: see _forward_looped_kernel
    while start < n_cols:
        start = tl.multiple_of(start, BLOCK)
        mask = start + cols < n_cols
        y = tl.load(y_row + start + cols, mask=mask, other=0.0).to(tl.float32)
        acc += y * tl.load(dy_row + start + cols, mask=mask, other=0.0).to(tl.float32)
        start += BLOCK
    dot = tl.sum(acc, axis=0)
    start -= BLOCK
    while start >= 0:
        start = tl.multiple_of(start, BLOCK)
        mask = start + cols < n_cols
        y = tl.load(y_row + start + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_row + start + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(dx_row + start + cols, (y * (dy - dot)).to(dx_ptr.dtype.element_ty), mask=mask)
        start -= BLOCK


TRITON_KERNELS = (
    _forward_rows_kernel,
    _forward_rows_ahead_kernel,
    _forward_split_kernel,
    _forward_split_pairs_kernel,
    _forward_looped_kernel,
    _backward_rows_kernel,
    _backward_looped_kernel,
)


@dataclass(frozen=True)
class Plan:
    """How one launch covers the rows.

    kernel: "rows", "rows_ahead", "split", "split_pairs" or "looped". block: columns per tile (rows: the padded row;
    split: one chunk; looped: one step). rows: rows per program (rows kernels). num_warps: warps per program.
    maxnreg: registers per thread at most (ptxas spills the rest), so more programs fit on an SM; None: no cap.
    hold: rows kernel, 16-bit rows: held in their storage type between the passes (half the registers).
    """

    kernel: str
    block: int
    rows: int = 1
    num_warps: int = 4
    maxnreg: int | None = None
    hold: bool = False


def _warps(elements: int, itemsize: int) -> int:
    """Warps for a program holding `elements` values of `itemsize` bytes, as timed on the H200 (tune.py): SHORT_WARPS
    for tiles of TILE_BYTES, 4 up to 8 KiB, then 16 (32 for fp32 rows of 16384 or more)."""
    nbytes = elements * itemsize
    if nbytes <= TILE_BYTES:
        return SHORT_WARPS[itemsize]
    if nbytes <= 8192:
        return 4
    return 32 if itemsize == 4 and elements >= 16384 else 16


def _rows_plan(block: int, dtype: torch.dtype) -> Plan:
    rows = max(1, TILE_BYTES // (block * dtype.itemsize))
    return Plan("rows", block, rows, _warps(block * rows, dtype.itemsize))


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _interpreted() -> bool:
    """Whether Triton runs kernels under its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def _can_wait(device: torch.device) -> bool:
    """Whether programs can wait for each other: on a GPU, not under the interpreter (programs one by one)."""
    return device.type == "cuda" and not _interpreted()


@functools.lru_cache(maxsize=4096)  # plans are looked up on every call: cached by (width, dtype, device)
def forward_plan(width: int, dtype: torch.dtype, device: torch.device) -> Plan:
    """The forward kernel for rows of `width` (see the module docstring)."""
    block = triton.next_power_of_2(width)
    if block <= ROW_MAX:
        if dtype == torch.bfloat16 and block in HELD_BF16:
            warps, maxnreg = HELD_BF16[block]
            return Plan("rows", block, 1, warps, maxnreg, hold=True)
        ahead_from, ahead_warps = AHEAD.get(dtype.itemsize, (ROW_MAX + 1, 0))
        if block >= ahead_from:
            return Plan("rows_ahead", block, 1, ahead_warps)
        return replace(_rows_plan(block, dtype), maxnreg=MAXNREG.get((dtype.itemsize, block)))
    if dtype == torch.bfloat16 and width % 2 == 0:
        kernel, (chunk, warps) = "split_pairs", SPLIT_PAIRS
    else:
        kernel, (chunk, warps) = "split", SPLIT[dtype.itemsize]
    if _can_wait(device) and triton.cdiv(width, chunk) <= _sm_count(device.index):
        return Plan(kernel, chunk, 1, warps)
    return Plan("looped", LOOP_BLOCK, 1, 8)


@functools.lru_cache(maxsize=4096)
def backward_plan(width: int, dtype: torch.dtype) -> Plan:
    """The backward kernel for rows of `width`: whole rows up to BACKWARD_ROW_MAX, else looped."""
    block = triton.next_power_of_2(width)
    return _rows_plan(block, dtype) if block <= BACKWARD_ROW_MAX else Plan("looped", LOOP_BLOCK, 1, 8)


def _in_pairs(*tensors: torch.Tensor) -> bool:
    """Whether (rows, width) bf16 tensors can be read as int32 pairs: even width and row strides, 4-byte aligned
    (while torch.compile traces, with no address to read, an even storage offset into an aligned allocation)."""
    return all(
        t.dtype == torch.bfloat16
        and t.shape[1] % 2 == 0
        and t.stride(0) % 2 == 0
        and (t.data_ptr() % 4 == 0 if type(t) is torch.Tensor else t.storage_offset() % 2 == 0)
        for t in tensors
    )


def _alignment(*tensors: torch.Tensor) -> int:
    """The most elements, up to one 16-byte vector, that the width and every row stride of `tensors` are multiples of.

    Triton proves a load 16-byte aligned only from integers it sees divisible by 16: a bf16 row of 17000 columns
    (34000 bytes, aligned) would be read 2 bytes at a time. Kernels take the width and strides divided by this and
    multiply back by it as a constexpr, which the compiler can see. 1 from 2^31 columns: kernels scale the width back
    in int32.
    """
    width = tensors[0].shape[1]
    if width >= 2**31:
        return 1
    return math.gcd(16 // tensors[0].element_size(), int(width), *(int(t.stride(0)) for t in tensors))


INTERPRETER_PROGRAMS = 3  # persistent grids under the interpreter: a few programs, each taking several tiles


def _ready(x: torch.Tensor) -> None:
    if not x.is_cuda and (reason := triton_unavailable("cpu")):
        raise RuntimeError(f"softmax triton: {reason}")


def launch_forward(x: torch.Tensor, y: torch.Tensor, plan: Plan | None = None) -> None:
    """y = softmax(x) row by row. x, y: (rows, width), unit column stride; plan: None chooses (`forward_plan`)."""
    _ready(x)
    n_rows, n_cols = x.shape[0], int(x.shape[1])  # the width picks the plan: a symbolic one (torch.compile) is fixed
    plan = plan or forward_plan(n_cols, x.dtype, x.device)
    with on_device(x):
        if plan.kernel == "rows":
            # Masks compiled out for fp32 tiles that divide the tensor: 0.1-0.3% faster at widths 128-1024. In 16 bits
            # the masked kernel was faster (bf16 rows of 128-256, 16 or 8 to a tile: 3922-3946 GB/s against 3841-3876;
            # 1024: 4196-4201 against 4151-4158; 16384 capped: 3962-4014 against 3753-3813), but not for held rows
            # (bf16 32768: 3983-4014 against 3880-3907; 16384: 4074-4076 against 4023-4102; softmax_explore_11).
            even = (x.element_size() == 4 or plan.hold) and n_cols == plan.block and n_rows % plan.rows == 0
            a = _alignment(x, y)
            wrap_triton(_forward_rows_kernel)[(triton.cdiv(n_rows, plan.rows),)](
                x, y, n_rows, n_cols // a, x.stride(0) // a, y.stride(0) // a, ROWS=plan.rows, BLOCK=plan.block,
                EVEN=even, HOLD=plan.hold and x.element_size() == 2, PTX=not _interpreted(), ALIGN=a,
                num_warps=plan.num_warps, maxnreg=plan.maxnreg,
            )  # fmt: skip
        elif plan.kernel == "rows_ahead":
            n_tiles = triton.cdiv(n_rows, plan.rows)
            programs = _sm_count(x.device.index) if x.is_cuda else INTERPRETER_PROGRAMS
            a = _alignment(x, y)
            wrap_triton(_forward_rows_ahead_kernel)[(min(n_tiles, programs),)](
                x, y, n_rows, n_cols // a, x.stride(0) // a, y.stride(0) // a, ROWS=plan.rows, BLOCK=plan.block,
                PTX=not _interpreted(), ALIGN=a, num_warps=plan.num_warps, maxnreg=plan.maxnreg,
            )  # fmt: skip
        elif plan.kernel in ("split", "split_pairs"):
            if plan.kernel == "split_pairs" and not _in_pairs(x, y):  # odd strides or offsets: one by one
                plan = Plan("split", plan.block, 1, plan.num_warps)
            split = triton.cdiv(n_cols, plan.block)
            if x.is_cuda and split > _sm_count(x.device.index):  # all chunks of a row must fit on the GPU at once
                raise ValueError(
                    f"softmax triton: {split} chunks of {plan.block} per row > {_sm_count(x.device.index)} SMs"
                )
            stats = torch.empty(2, n_rows * split, dtype=torch.float32, device=x.device)
            sync = torch.zeros(1 + n_rows, dtype=torch.int32, device=x.device)
            meta = {"SPLIT": split, "SPLIT_P2": triton.next_power_of_2(split), "num_warps": plan.num_warps}
            if plan.kernel == "split_pairs":
                wrap_triton(_forward_split_pairs_kernel)[(n_rows * split,)](
                    x, y, stats[0], stats[1], sync, n_cols // 2, x.stride(0) // 2, y.stride(0) // 2,
                    CHUNK=plan.block // 2, PTX=not _interpreted(), **meta,
                )  # fmt: skip
            else:
                wrap_triton(_forward_split_kernel)[(n_rows * split,)](
                    x, y, stats[0], stats[1], sync, n_cols, x.stride(0), y.stride(0), CHUNK=plan.block,
                    PTX=not _interpreted(), **meta,
                )  # fmt: skip
        elif plan.kernel == "looped":
            a = _alignment(x, y)
            wrap_triton(_forward_looped_kernel)[(n_rows,)](
                x, y, n_cols // a, x.stride(0) // a, y.stride(0) // a, BLOCK=plan.block, PTX=not _interpreted(),
                ALIGN=a, num_warps=plan.num_warps,
            )  # fmt: skip
        else:
            raise ValueError(
                f"unknown softmax kernel {plan.kernel!r}; known: rows, rows_ahead, split, split_pairs, looped"
            )


def launch_backward(y: torch.Tensor, dy: torch.Tensor, dx: torch.Tensor, plan: Plan | None = None) -> None:
    """dx = y * (dy - sum(dy * y)) row by row. All (rows, width), unit column stride; plan: None chooses."""
    _ready(y)
    n_rows, n_cols = y.shape[0], int(y.shape[1])
    plan = plan or backward_plan(n_cols, y.dtype)
    strides = (y.stride(0), dy.stride(0), dx.stride(0))
    with on_device(y):
        if plan.kernel == "rows":
            a = _alignment(y, dy, dx)
            wrap_triton(_backward_rows_kernel)[(triton.cdiv(n_rows, plan.rows),)](
                y, dy, dx, n_rows, n_cols // a, *(s // a for s in strides), ROWS=plan.rows, BLOCK=plan.block, ALIGN=a,
                num_warps=plan.num_warps,
            )  # fmt: skip
        elif plan.kernel == "looped":
            a = _alignment(y, dy, dx)
            wrap_triton(_backward_looped_kernel)[(n_rows,)](
                y, dy, dx, n_cols // a, *(s // a for s in strides), BLOCK=plan.block, ALIGN=a, num_warps=plan.num_warps
            )
        else:
            raise ValueError(f"unknown softmax backward kernel {plan.kernel!r}; known: rows, looped")


DEVICES = ("cpu", "cuda")  # the CPU under TRITON_INTERPRET=1 only (slow: for tests)

_forward, _backward = _shared.row_functions(launch_forward, launch_backward)
_check, _backward_check = _shared.make_checks("softmax triton", DEVICES)
softmax_triton_op = define_op(
    "softmax_triton",
    _forward,
    backward=_backward,
    fake=_shared.fake,
    backward_fake=_shared.backward_fake,
    check=_check,
    backward_check=_backward_check,
    kind="triton",
)


@SOFTMAX.impl(
    "triton", devices=DEVICES, requires=triton_unavailable, backward=True, triton_kernels=lambda: TRITON_KERNELS
)
def softmax_triton(x: torch.Tensor) -> torch.Tensor:
    """Triton, chosen by width: rows whole in registers (several short ones per program), a wide row split over
    programs that meet through global memory (bf16 held in pairs), or a looped online softmax. fp32 math, 64-bit row
    offsets."""
    return softmax_triton_op(x)
