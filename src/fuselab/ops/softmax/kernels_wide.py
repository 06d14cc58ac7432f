"""Triton softmax kernels for rows too wide for one program's registers: a row split over programs that meet
through global memory (one by one, or bf16 held as int32 pairs), and the looped online softmax (forward and
backward). See kernels_rows.py for the conventions and plans.py for when each is chosen.
"""

from __future__ import annotations

import triton
import triton.language as tl

from fuselab.ops.softmax.kernels_rows import _aligned_bulk, _edge_columns, _exp


@triton.jit
def _row_of_ticket(sync_ptr, SPLIT: tl.constexpr):
    """(ticket, row, chunk) for a program of a split kernel: its work, in the order programs start running. The last
    ticket's taker sets the ticket counter back to 0: every other ticket is taken by then."""
    ticket = tl.atomic_add(sync_ptr, 1).to(tl.int64)
    if ticket == tl.num_programs(0) - 1:
        tl.atomic_xchg(sync_ptr, 0)
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
    # Leaving, count on to 2 * SPLIT; the row's last to leave sets its counter back to 0 (the others have stopped
    # reading it), so the counters are zeros again when the kernel ends: the next launch needs no memset.
    if tl.atomic_add(arrived, 1) == 2 * SPLIT - 1:
        tl.atomic_xchg(arrived, 0)
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
    span,
    SPLIT: tl.constexpr,
    SPLIT_P2: tl.constexpr,
    CHUNK: tl.constexpr,
    PTX: tl.constexpr,
    ALIGN: tl.constexpr,
    EDGES: tl.constexpr,
    VEC: tl.constexpr,
):
    """One span of `span` columns (<= CHUNK, a multiple of 16) of one row per program, SPLIT programs per row (grid
    n_rows * SPLIT); GPU only. n_cols and the row strides come divided by ALIGN (see `launch.alignment`: else a row of
    whole 16-byte vectors whose width is not a multiple of 16 is read 4 bytes at a time).

    max_ptr, sum_ptr: (n_rows * SPLIT,) fp32 scratch. sync_ptr: (1 + n_rows,) int32 zeros, left zeros when the kernel
    ends (a workspace kept from launch to launch on one stream); [0] hands out tickets, [1 + row] counts the chunks
    of a row that have published their (max, sum). Waiting for the rest of a row cannot
    deadlock: a program's work is its ticket, taken when it starts running, so the tickets taken are 0..T-1; every row
    but the last one begun has all its programs running, finishes, and frees room for the next tickets. It needs
    SPLIT programs to fit on the GPU at once: the caller keeps SPLIT <= the number of SMs. PTX: fast exp (`_exp`).
    EDGES: spans are laid from each row's first 16-byte boundary (`_aligned_bulk`); the first program of a row also
    takes the row's edges.
    """
    n_cols = n_cols * ALIGN  # ALIGN is 1 from 2^31 columns, so this never overflows
    ticket, row, chunk = _row_of_ticket(sync_ptr, SPLIT)
    lanes = tl.arange(0, CHUNK)
    x_start = row * x_row_stride * ALIGN
    y_start = row * y_row_stride * ALIGN
    if EDGES:
        shift, n_bulk, x_bulk = _aligned_bulk(x_start, n_cols, VEC)
        y_bulk = (y_start + shift) // VEC * VEC
        cols = chunk * span + lanes
        mask = (lanes < span) & (cols < n_bulk)
        x = tl.load(x_ptr + x_bulk + cols, mask=mask, other=float("-inf")).to(tl.float32)
        e_cols, e_mask = _edge_columns(shift, n_bulk, n_cols, VEC)
        e_cols = tl.reshape(e_cols, [2 * VEC])
        e_mask = tl.reshape(e_mask, [2 * VEC]) & (chunk == 0)
        e = tl.load(x_ptr + x_start + e_cols, mask=e_mask, other=float("-inf")).to(tl.float32)
        chunk_max = tl.maximum(tl.max(x, axis=0), tl.max(e, axis=0))
    else:
        cols = chunk * span + lanes
        mask = (lanes < span) & (cols < n_cols)
        x = tl.load(x_ptr + x_start + cols, mask=mask, other=float("-inf")).to(tl.float32)
        chunk_max = tl.max(x, axis=0)
    shift_max = tl.where(chunk_max == float("-inf"), 0.0, chunk_max)  # an all -inf chunk has sum 0, not NaN
    chunk_sum = tl.sum(_exp(x - shift_max, PTX), axis=0)
    if EDGES:
        chunk_sum += tl.sum(_exp(e - shift_max, PTX), axis=0)
    row_max, inv_sum = _row_max_and_inv_sum(
        max_ptr, sum_ptr, sync_ptr, ticket, row, chunk_max, chunk_sum, SPLIT, SPLIT_P2
    )
    y = (_exp(x - row_max, PTX) * inv_sum).to(y_ptr.dtype.element_ty)
    if EDGES:
        tl.store(y_ptr + y_bulk + cols, y, mask=mask)
        ye = (_exp(e - row_max, PTX) * inv_sum).to(y_ptr.dtype.element_ty)
        tl.store(y_ptr + y_start + e_cols, ye, mask=e_mask)
    else:
        tl.store(y_ptr + y_start + cols, y, mask=mask)


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
    ALIGN: tl.constexpr,
):
    """_forward_split_kernel for bf16 rows of even width, read and held as int32 pairs: one register per two columns.

    x_ptr, y_ptr: bf16, 4-byte aligned; rows of 2 * n_pairs columns; row strides and CHUNK counted in pairs; n_pairs
    and the row strides come divided by ALIGN pairs (4 for rows of whole 16-byte vectors: else Triton cannot prove
    a row's start aligned from a stride it sees no multiple of 16, and reads 4 bytes at a time).
    PTX: inline PTX allowed (not under the interpreter). Used for rows of whole 16-byte vectors only (launch.py).
    """
    n_pairs = n_pairs * ALIGN
    ticket, row, chunk = _row_of_ticket(sync_ptr, SPLIT)  # row: int64, so row * stride * ALIGN never overflows
    cols = chunk * CHUNK + tl.arange(0, CHUNK)
    mask = cols < n_pairs
    x_pairs = x_ptr.to(tl.pointer_type(tl.int32)) + row * x_row_stride * ALIGN
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
    tl.store(y_ptr.to(tl.pointer_type(tl.int32)) + row * y_row_stride * ALIGN + cols, y, mask=mask)


@triton.jit
def _forward_looped_kernel(
    x_ptr,
    y_ptr,
    n_cols,
    x_row_stride,
    y_row_stride,
    BLOCK: tl.constexpr,
    PTX: tl.constexpr,
    ALIGN: tl.constexpr,
    EDGES: tl.constexpr,
    VEC: tl.constexpr,
):
    """One row per program in steps of BLOCK columns: online max and sum, then a second pass writes y. PTX: fast
    exp (`_exp`). n_cols and the row strides come divided by ALIGN (see `launch.alignment`). EDGES: the steps cover
    the row's aligned bulk (`_aligned_bulk`), its edges are taken apart."""
    n_cols = n_cols * ALIGN  # ALIGN is 1 from 2^31 columns, so this never overflows
    row = tl.program_id(0).to(tl.int64)
    x_start = row * x_row_stride * ALIGN
    y_start = row * y_row_stride * ALIGN
    cols = tl.arange(0, BLOCK)
    if EDGES:
        shift, n_bulk, x_bulk = _aligned_bulk(x_start, n_cols, VEC)
        y_bulk = (y_start + shift) // VEC * VEC
        e_cols, e_mask = _edge_columns(shift, n_bulk, n_cols, VEC)
        e_cols = tl.reshape(e_cols, [2 * VEC])
        e_mask = tl.reshape(e_mask, [2 * VEC])
        e = tl.load(x_ptr + x_start + e_cols, mask=e_mask, other=float("-inf")).to(tl.float32)
        e_max = tl.max(e, axis=0)
        e_sum = tl.sum(_exp(e - tl.where(e_max == float("-inf"), 0.0, e_max), PTX), axis=0)
    else:
        n_bulk = n_cols
        x_bulk = x_start
        y_bulk = y_start
        e_max = float("-inf")
        e_sum = 0.0
    x_row = x_ptr + x_bulk
    y_row = y_ptr + y_bulk
    m = tl.full([BLOCK], float("-inf"), tl.float32)  # per lane: running max, and sum of exp(x - m)
    s = tl.zeros([BLOCK], tl.float32)
    # `while`, from when the interpreter could not run a `for` to a runtime bound (fuselab.interpreter mends that
    # now; a `for` here is untimed on the GPU). int64 columns: a row may pass 2^31 elements.
    start = tl.full((), 0, tl.int64)
    while start < n_bulk:
        start = tl.multiple_of(start, BLOCK)  # lost on a `while` variable; without it no 16-byte loads
        x = tl.load(x_row + start + cols, mask=start + cols < n_bulk, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, x)
        shift_max = tl.where(m_new == float("-inf"), 0.0, m_new)  # a lane that saw only -inf keeps s = 0, not NaN
        s = s * _exp(m - shift_max, PTX) + _exp(x - shift_max, PTX)
        m = m_new
        start += BLOCK
    row_max = tl.maximum(tl.max(m, axis=0), e_max)
    inv_sum = 1.0 / (tl.sum(s * tl.exp(m - row_max), axis=0) + e_sum * tl.exp(e_max - row_max))
    if EDGES:
        ye = (_exp(e - row_max, PTX) * inv_sum).to(y_ptr.dtype.element_ty)
        tl.store(y_ptr + y_start + e_cols, ye, mask=e_mask)
    # Write from the end back: the end of the row was read last and is the likeliest still in L2.
    start -= BLOCK
    while start >= 0:
        start = tl.multiple_of(start, BLOCK)
        mask = start + cols < n_bulk
        x = tl.load(x_row + start + cols, mask=mask, other=float("-inf")).to(tl.float32)
        tl.store(y_row + start + cols, (_exp(x - row_max, PTX) * inv_sum).to(y_ptr.dtype.element_ty), mask=mask)
        start -= BLOCK


@triton.jit
def _backward_row_bulk(y_start, dy_start, dx_start, n_cols, EDGES: tl.constexpr, VEC: tl.constexpr):
    """Where the backward kernels read a row of y, dy and dx that start at these element offsets (one phase from a
    16-byte boundary, `launch.edges`): (bulk columns, the bulk's start in y, dy and dx, the edges' columns and mask).
    EDGES: the bulk is the row's whole 16-byte vectors (`_aligned_bulk`), the edges the columns before and after it;
    else the bulk is the whole row and the edges are none."""
    if EDGES:
        shift, n_bulk, y_bulk = _aligned_bulk(y_start, n_cols, VEC)
        dy_bulk = (dy_start + shift) // VEC * VEC
        dx_bulk = (dx_start + shift) // VEC * VEC
        e_cols, e_mask = _edge_columns(shift, n_bulk, n_cols, VEC)
        e_cols = tl.reshape(e_cols, [2 * VEC])
        e_mask = tl.reshape(e_mask, [2 * VEC])
    else:  # one return, of one type either way
        n_bulk = n_cols.to(tl.int64)
        y_bulk, dy_bulk, dx_bulk = y_start, dy_start, dx_start
        e_cols = tl.arange(0, 2 * VEC).to(tl.int64)
        e_mask = e_cols < 0
    return n_bulk, y_bulk, dy_bulk, dx_bulk, e_cols, e_mask


@triton.jit
def _backward_looped_kernel(
    y_ptr,
    dy_ptr,
    dx_ptr,
    n_cols,
    y_row_stride,
    dy_row_stride,
    dx_row_stride,
    BLOCK: tl.constexpr,
    ALIGN: tl.constexpr,
    EDGES: tl.constexpr,
    VEC: tl.constexpr,
):
    """dx = y * (dy - sum(dy * y)), one row per program in steps of BLOCK: a pass for the sum, a pass for dx.
    n_cols and the row strides come divided by ALIGN (see `launch.alignment`). EDGES: the steps cover the row's
    aligned bulk in 16-byte vectors (`_backward_row_bulk`), its edges are taken apart."""
    n_cols = n_cols * ALIGN  # as in _forward_looped_kernel
    row = tl.program_id(0).to(tl.int64)
    y_start = row * y_row_stride * ALIGN
    dy_start = row * dy_row_stride * ALIGN
    dx_start = row * dx_row_stride * ALIGN
    n_bulk, y_bulk, dy_bulk, dx_bulk, e_cols, e_mask = _backward_row_bulk(
        y_start, dy_start, dx_start, n_cols, EDGES, VEC
    )
    y_row = y_ptr + y_bulk
    dy_row = dy_ptr + dy_bulk
    dx_row = dx_ptr + dx_bulk
    cols = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    start = tl.full((), 0, tl.int64)  # `while`: see _forward_looped_kernel
    while start < n_bulk:
        start = tl.multiple_of(start, BLOCK)
        mask = start + cols < n_bulk
        y = tl.load(y_row + start + cols, mask=mask, other=0.0).to(tl.float32)
        acc += y * tl.load(dy_row + start + cols, mask=mask, other=0.0).to(tl.float32)
        start += BLOCK
    dot = tl.sum(acc, axis=0)
    if EDGES:
        ey = tl.load(y_ptr + y_start + e_cols, mask=e_mask, other=0.0).to(tl.float32)
        edy = tl.load(dy_ptr + dy_start + e_cols, mask=e_mask, other=0.0).to(tl.float32)
        dot += tl.sum(ey * edy, axis=0)
        tl.store(dx_ptr + dx_start + e_cols, (ey * (edy - dot)).to(dx_ptr.dtype.element_ty), mask=e_mask)
    start -= BLOCK
    while start >= 0:
        start = tl.multiple_of(start, BLOCK)
        mask = start + cols < n_bulk
        y = tl.load(y_row + start + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_row + start + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(dx_row + start + cols, (y * (dy - dot)).to(dx_ptr.dtype.element_ty), mask=mask)
        start -= BLOCK


@triton.jit
def _backward_partial_dot_kernel(
    y_ptr,
    dy_ptr,
    dot_ptr,
    n_cols,
    y_row_stride,
    dy_row_stride,
    split,
    BLOCK: tl.constexpr,
    ALIGN: tl.constexpr,
    EDGES: tl.constexpr,
    VEC: tl.constexpr,
):
    """The backward of few wide rows, first kernel: program p (grid n_rows * split) sums y * dy over the bulk's
    columns [c * BLOCK, (c + 1) * BLOCK) of row r (p = r * split + c; c = 0 adds the row's edges: EDGES, as in
    _backward_looped_kernel) into dot_ptr[p] (fp32). n_cols and the row strides come divided by ALIGN (see
    `launch.alignment`)."""
    n_cols = n_cols * ALIGN
    program = tl.program_id(0).to(tl.int64)
    row = program // split
    part = program % split
    y_start = row * y_row_stride * ALIGN
    dy_start = row * dy_row_stride * ALIGN
    n_bulk, y_bulk, dy_bulk, _, e_cols, e_mask = _backward_row_bulk(y_start, dy_start, dy_start, n_cols, EDGES, VEC)
    cols = part * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_bulk
    y = tl.load(y_ptr + y_bulk + cols, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + dy_bulk + cols, mask=mask, other=0.0).to(tl.float32)
    dot = tl.sum(y * dy, axis=0)
    if EDGES:
        e_mask = e_mask & (part == 0)
        ey = tl.load(y_ptr + y_start + e_cols, mask=e_mask, other=0.0).to(tl.float32)
        edy = tl.load(dy_ptr + dy_start + e_cols, mask=e_mask, other=0.0).to(tl.float32)
        dot += tl.sum(ey * edy, axis=0)
    tl.store(dot_ptr + program, dot)


@triton.jit
def _backward_split_kernel(
    y_ptr,
    dy_ptr,
    dx_ptr,
    dot_ptr,
    n_cols,
    y_row_stride,
    dy_row_stride,
    dx_row_stride,
    split,
    BLOCK: tl.constexpr,
    PARTS: tl.constexpr,
    ALIGN: tl.constexpr,
    EDGES: tl.constexpr,
    VEC: tl.constexpr,
):
    """The backward of few wide rows, second kernel (the grid of `_backward_partial_dot_kernel`): the row's `split`
    partial sums added in one fixed order (PARTS at a time: the same gradients on every call), then dx = y * (dy -
    sum) over the program's columns of the bulk (and the row's edges where c = 0: EDGES)."""
    n_cols = n_cols * ALIGN
    program = tl.program_id(0).to(tl.int64)
    row = program // split
    part = program % split
    parts = tl.arange(0, PARTS)
    acc = tl.zeros([PARTS], tl.float32)
    start = 0  # `while`: see _forward_looped_kernel
    while start < split:
        acc += tl.load(dot_ptr + row * split + start + parts, mask=start + parts < split, other=0.0)
        start += PARTS
    dot = tl.sum(acc, axis=0)
    y_start = row * y_row_stride * ALIGN
    dy_start = row * dy_row_stride * ALIGN
    dx_start = row * dx_row_stride * ALIGN
    n_bulk, y_bulk, dy_bulk, dx_bulk, e_cols, e_mask = _backward_row_bulk(
        y_start, dy_start, dx_start, n_cols, EDGES, VEC
    )
    if EDGES:
        e_mask = e_mask & (part == 0)
        ey = tl.load(y_ptr + y_start + e_cols, mask=e_mask, other=0.0).to(tl.float32)
        edy = tl.load(dy_ptr + dy_start + e_cols, mask=e_mask, other=0.0).to(tl.float32)
        tl.store(dx_ptr + dx_start + e_cols, (ey * (edy - dot)).to(dx_ptr.dtype.element_ty), mask=e_mask)
    cols = part * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_bulk
    y = tl.load(y_ptr + y_bulk + cols, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + dy_bulk + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(dx_ptr + dx_bulk + cols, (y * (dy - dot)).to(dx_ptr.dtype.element_ty), mask=mask)
