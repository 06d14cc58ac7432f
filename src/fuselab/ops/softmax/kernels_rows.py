"""Triton softmax kernels that hold whole rows in registers: the rows kernel (several short rows per program, or
one), its persistent one-row-ahead variant, the rows backward, and the single-column kernels (rows of one element,
elementwise); with the helpers the wide kernels share (fast
exp, 16-bit conversions, the aligned-bulk split of a misaligned row).

Rows are (n_rows, n_cols) with unit column stride and a row stride; row offsets are int64. Math is in fp32; the max
is subtracted before exp, so -inf entries give 0 and a row that is all -inf (or holds +inf or NaN) gives NaN, as
torch.softmax does. Plans (which kernel, tile, warps) are chosen in plans.py; launch.py launches them.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _exp(x, PTX: tl.constexpr):
    """exp of fp32 x. PTX: one ex2.approx.ftz (a single MUFU.EX2; tl.exp's ex2.approx also compares and scales twice
    for subnormals, which a softmax does not need: results below 2^-126 become 0). PTX False: tl.exp."""
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
def _softmax_of_rows(x, e, HOLD: tl.constexpr, PTX: tl.constexpr, EDGES: tl.constexpr):
    """softmax along axis 1 of a [ROWS, BLOCK] tile x and (EDGES) the rest of the same rows in a [ROWS, 2 VEC] tile
    e; returns (y, y of e) in fp32 (without EDGES, e is returned as given).

    HOLD (16-bit x): x stays in its storage type between the passes, converted to fp32 for each (max, sum of exp,
    output, exp computed twice), so only the 16-bit values are live across the two reductions: half the registers.
    Spelled alike, the three conversions would be merged into one whose fp32 values stay live. PTX: fast exp.
    """
    if EDGES:
        e = e.to(tl.float32)
    if HOLD:
        row_max = tl.max(_held_as_fp32(x, 0, PTX), axis=1, keep_dims=True)
        if EDGES:
            row_max = tl.maximum(row_max, tl.max(e, axis=1, keep_dims=True))
        total = tl.sum(_exp(_held_as_fp32(x, 1, PTX) - row_max, PTX), axis=1, keep_dims=True)
        if EDGES:
            total += tl.sum(_exp(e - row_max, PTX), axis=1, keep_dims=True)
        inv = 1.0 / total
        y = _exp(_held_as_fp32(x, 2, PTX) - row_max, PTX) * inv
    else:
        x = x.to(tl.float32)
        row_max = tl.max(x, axis=1, keep_dims=True)
        if EDGES:
            row_max = tl.maximum(row_max, tl.max(e, axis=1, keep_dims=True))
        y = _exp(x - row_max, PTX)
        total = tl.sum(y, axis=1, keep_dims=True)
        if EDGES:
            e = _exp(e - row_max, PTX)
            total += tl.sum(e, axis=1, keep_dims=True)
        inv = 1.0 / total
        y = y * inv
    if EDGES:
        if HOLD:
            e = _exp(e - row_max, PTX)
        e = e * inv
    return y, e


@triton.jit
def _aligned_bulk(start, n_cols, VEC: tl.constexpr):
    """For rows starting at element offsets `start` of a 16-byte aligned buffer: (shift, bulk columns, aligned
    start) such that columns [shift, shift + bulk) of each row are whole 16-byte vectors from `start + shift`, which
    the compiler sees as a multiple of VEC (so it loads 16 bytes at a time); the rest is the row's edges. Rows are at
    least VEC long (`launch.edges` sends narrower ones elsewhere), so a row never ends before its shift."""
    shift = (VEC - start % VEC) % VEC
    return shift, (n_cols - shift) // VEC * VEC, (start + shift) // VEC * VEC


@triton.jit
def _edge_columns(shift, n_bulk, n_cols, VEC: tl.constexpr):
    """Columns ([.., 2 VEC]) and mask of the edges of rows split by `_aligned_bulk`: the head [0, shift) in the first
    VEC lanes, the tail [shift + n_bulk, n_cols) in the last VEC. (The head is not masked by n_cols: that changed how
    ptxas schedules the rows backward's loads; docs/ops/softmax.md, "Rows narrower than a vector".)"""
    j = tl.arange(0, 2 * VEC)[None, :]
    cols = tl.where(j < VEC, j, shift + n_bulk + j - VEC)
    return cols, tl.where(j < VEC, j < shift, cols < n_cols)


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
    EDGES: tl.constexpr,
    VEC: tl.constexpr,
):
    """ROWS whole rows per program. x, y: (n_rows, n_cols), unit column stride; BLOCK >= n_cols, a power of 2.

    EVEN (n_cols == BLOCK and ROWS divides n_rows): no masks. Otherwise rows past the end read the last row again
    (no NaN from empty rows) and are not stored. EDGES (rows not a whole number of 16-byte vectors, x and y 16-byte
    aligned, row strides equal modulo VEC = 16 bytes in elements): each row is read as an aligned bulk of 16-byte
    vectors and a few edge elements apart (`_aligned_bulk`). HOLD, PTX: see _softmax_of_rows. n_cols and the row
    strides come divided by ALIGN (see `launch.alignment`).
    """
    n_cols = n_cols * ALIGN  # at most 32768: no overflow; row offsets below are int64 before they are scaled
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)[:, None]
    cols = tl.arange(0, BLOCK)[None, :]
    out_ty = y_ptr.dtype.element_ty
    if EDGES:
        src = tl.minimum(rows, n_rows - 1)
        x_start = src * x_row_stride * ALIGN
        y_start = src * y_row_stride * ALIGN
        shift, n_bulk, x_bulk = _aligned_bulk(x_start, n_cols, VEC)
        y_bulk = (y_start + shift) // VEC * VEC
        x = tl.load(x_ptr + x_bulk + cols, mask=cols < n_bulk, other=float("-inf"))
        e_cols, e_mask = _edge_columns(shift, n_bulk, n_cols, VEC)
        e = tl.load(x_ptr + x_start + e_cols, mask=e_mask, other=float("-inf"))
        y, ye = _softmax_of_rows(x, e, HOLD, PTX, True)
        keep = rows < n_rows
        tl.store(y_ptr + y_bulk + cols, y.to(out_ty), mask=keep & (cols < n_bulk))
        tl.store(y_ptr + y_start + e_cols, ye.to(out_ty), mask=keep & e_mask)
    elif EVEN:
        x = tl.load(x_ptr + rows * x_row_stride * ALIGN + cols)
        y, _ = _softmax_of_rows(x, x, HOLD, PTX, False)
        tl.store(y_ptr + rows * y_row_stride * ALIGN + cols, y.to(out_ty))
    else:
        x_rows = x_ptr + tl.minimum(rows, n_rows - 1) * x_row_stride * ALIGN
        x = tl.load(x_rows + cols, mask=cols < n_cols, other=float("-inf"))
        y, _ = _softmax_of_rows(x, x, HOLD, PTX, False)
        tl.store(y_ptr + rows * y_row_stride * ALIGN + cols, y.to(out_ty), mask=(rows < n_rows) & (cols < n_cols))


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
    strides come divided by ALIGN (see `launch.alignment`)."""
    n_cols = n_cols * ALIGN  # as in _forward_rows_kernel
    step = tl.num_programs(0) * ROWS
    start = tl.program_id(0).to(tl.int64) * ROWS
    rows = start + tl.arange(0, ROWS)[:, None]
    cols = tl.arange(0, BLOCK)[None, :]
    ahead = tl.load(
        x_ptr + rows * x_row_stride * ALIGN + cols, mask=(rows < n_rows) & (cols < n_cols), other=float("-inf")
    )
    # `while`, not `for`: see _forward_looped_kernel.
    while start < n_rows:
        x = ahead
        after = rows + step
        ahead = tl.load(
            x_ptr + after * x_row_stride * ALIGN + cols, mask=(after < n_rows) & (cols < n_cols), other=float("-inf")
        )
        y, _ = _softmax_of_rows(x, x, False, PTX, False)
        y = y.to(y_ptr.dtype.element_ty)
        tl.store(y_ptr + rows * y_row_stride * ALIGN + cols, y, mask=(rows < n_rows) & (cols < n_cols))
        rows = after
        start += step


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
    EDGES: tl.constexpr,
    VEC: tl.constexpr,
):
    """dx = y * (dy - sum(dy * y)) for ROWS whole rows per program; all (n_rows, n_cols), unit column stride.
    n_cols and the row strides come divided by ALIGN (see `launch.alignment`); EDGES as in _forward_rows_kernel."""
    n_cols = n_cols * ALIGN  # as in _forward_rows_kernel
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)[:, None]
    cols = tl.arange(0, BLOCK)[None, :]
    src = tl.minimum(rows, n_rows - 1)  # rows past the end read the last row again and are not stored
    out_ty = dx_ptr.dtype.element_ty
    if EDGES:
        y_start = src * y_row_stride * ALIGN
        dy_start = src * dy_row_stride * ALIGN
        dx_start = src * dx_row_stride * ALIGN
        shift, n_bulk, y_bulk = _aligned_bulk(y_start, n_cols, VEC)
        dy_bulk = (dy_start + shift) // VEC * VEC
        dx_bulk = (dx_start + shift) // VEC * VEC
        bulk = cols < n_bulk
        y = tl.load(y_ptr + y_bulk + cols, mask=bulk, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + dy_bulk + cols, mask=bulk, other=0.0).to(tl.float32)
        e_cols, e_mask = _edge_columns(shift, n_bulk, n_cols, VEC)
        ye = tl.load(y_ptr + y_start + e_cols, mask=e_mask, other=0.0).to(tl.float32)
        dye = tl.load(dy_ptr + dy_start + e_cols, mask=e_mask, other=0.0).to(tl.float32)
        dot = tl.sum(y * dy, axis=1, keep_dims=True) + tl.sum(ye * dye, axis=1, keep_dims=True)
        keep = rows < n_rows
        tl.store(dx_ptr + dx_bulk + cols, (y * (dy - dot)).to(out_ty), mask=keep & bulk)
        tl.store(dx_ptr + dx_start + e_cols, (ye * (dye - dot)).to(out_ty), mask=keep & e_mask)
    else:
        y = tl.load(y_ptr + src * y_row_stride * ALIGN + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + src * dy_row_stride * ALIGN + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
        dx = y * (dy - tl.sum(y * dy, axis=1, keep_dims=True))
        tl.store(dx_ptr + rows * dx_row_stride * ALIGN + cols, dx.to(out_ty), mask=(rows < n_rows) & (cols < n_cols))


@triton.jit
def _forward_single_kernel(x_ptr, y_ptr, n_rows, x_stride, y_stride, BLOCK: tl.constexpr):
    """Rows of one column, BLOCK rows a program, elementwise: the softmax of one value, 1 where x is finite and NaN
    where not (x - max is inf - inf). Programs whose BLOCK lies inside the rows run unmasked (16-byte vectors where
    the strides are 1, whatever n_rows is); only the last is masked."""
    start = tl.program_id(0).to(tl.int64) * BLOCK
    rows = start + tl.arange(0, BLOCK)
    if start + BLOCK <= n_rows:
        x = tl.load(x_ptr + rows * x_stride).to(tl.float32)
        y = tl.where(tl.abs(x) < float("inf"), 1.0, float("nan"))
        tl.store(y_ptr + rows * y_stride, y.to(y_ptr.dtype.element_ty))
    else:
        x = tl.load(x_ptr + rows * x_stride, mask=rows < n_rows, other=0.0).to(tl.float32)
        y = tl.where(tl.abs(x) < float("inf"), 1.0, float("nan"))
        tl.store(y_ptr + rows * y_stride, y.to(y_ptr.dtype.element_ty), mask=rows < n_rows)


@triton.jit
def _backward_single_kernel(y_ptr, dy_ptr, dx_ptr, n_rows, y_stride, dy_stride, dx_stride, BLOCK: tl.constexpr):
    """Rows of one column, as _forward_single_kernel: dx = y * (dy - y * dy), the row's sum of y * dy being its one
    term (0 where y and dy are finite; NaN where either is not, as the rows kernel gives)."""
    start = tl.program_id(0).to(tl.int64) * BLOCK
    rows = start + tl.arange(0, BLOCK)
    if start + BLOCK <= n_rows:
        y = tl.load(y_ptr + rows * y_stride).to(tl.float32)
        dy = tl.load(dy_ptr + rows * dy_stride).to(tl.float32)
        tl.store(dx_ptr + rows * dx_stride, (y * (dy - y * dy)).to(dx_ptr.dtype.element_ty))
    else:
        y = tl.load(y_ptr + rows * y_stride, mask=rows < n_rows, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + rows * dy_stride, mask=rows < n_rows, other=0.0).to(tl.float32)
        tl.store(dx_ptr + rows * dx_stride, (y * (dy - y * dy)).to(dx_ptr.dtype.element_ty), mask=rows < n_rows)
