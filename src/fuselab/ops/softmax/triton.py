"""Softmax over the last dimension in Triton: three forward kernels chosen by row width, two backward kernels.

The input is seen as (rows, width) with unit stride along the width (see `_shared.as_rows`); each kernel takes row
strides, so sliced rows need no copy. Row offsets are int64 (rows * stride passes 2^31 at 256 MiB sizes). Math is in
fp32 whatever the storage dtype; the max is subtracted before exp, so 1e30 does not overflow, -inf entries give 0, and
a row that is all -inf (or holds +inf or NaN) gives NaN, as torch.softmax does.

Which kernel (`forward_plan`, thresholds below; docs/ops/softmax.md explains them):

- width <= row_max(dtype) (32768 fp32, 65536 bf16): `_forward_rows_kernel`, rows held whole in registers, read once
  and written once. Short rows go several to a program (a [ROWS, BLOCK] tile of about TILE_BYTES); from 2048 fp32
  columns it is one row per program, the lecture's kernel.
- wider, on a GPU, up to one chunk per SM: `_forward_split_kernel`. A row is cut into chunks of
  split_chunk(dtype) columns, one program each; every program keeps its chunk in registers, publishes its
  (max, sum of exp) to global memory, waits for the other chunks of its row, and writes its chunk: the row is
  still read once and written once.
- otherwise (wider still, or under the CPU interpreter, which runs programs one after another and so cannot wait):
  `_forward_looped_kernel`, an online softmax: one pass for max and sum together, one pass to write (reads 2x).
"""

from __future__ import annotations

import contextlib
import functools
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from fuselab.ops.backends import triton_unavailable
from fuselab.ops.softmax._shared import define_custom_ops
from fuselab.ops.softmax.spec import SOFTMAX

# Thresholds timed on the H200 with tune.py (2026-11-29, 2^26-element tensors; the copy ceiling is ~4250 GB/s).
# A row held whole by one program: up to ROW_MAX_BYTES of input (32768 fp32 or 65536 bf16 columns). This kernel
# moved 3904-3956 GB/s at fp32 width 32768 (split kernel: 3142-3336) and 2723 at bf16 width 65536 (split: 1928-2415),
# although at 65536 columns ptxas spills 84 bytes per thread.
# Backward holds y and dy, so fewer.
ROW_MAX_BYTES = 131072
BACKWARD_ROW_MAX = 8192
# Short rows go several to a program, so each program moves about TILE_BYTES with 4 warps: 4 KiB per program
# (e.g. 8 fp32 rows of 128) reached 4092-4105 GB/s fp32 and 3905-3938 bf16, 8 KiB 3972-4035 and 3718-3885.
TILE_BYTES = 4096
# Columns per program in the split kernel, by element size: fp32 16384 columns moved 3191-3307 GB/s at widths
# 65536-262144 (8192: 3023-3134); bf16 8192 columns 2268-2415 (16384: 2187-2307, 32768: 1835-2004).
SPLIT_CHUNK = {4: 16384, 2: 8192}
LOOP_BLOCK = 4096


@triton.jit
def _forward_rows_kernel(
    x_ptr, y_ptr, n_rows, n_cols, x_row_stride, y_row_stride, ROWS: tl.constexpr, BLOCK: tl.constexpr
):
    """ROWS whole rows per program. x, y: (n_rows, n_cols), unit column stride; BLOCK >= n_cols, a power of 2.

    Rows past the end read the last row again (no NaN from empty rows) and are not stored.
    """
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)[:, None]
    cols = tl.arange(0, BLOCK)[None, :]
    x_rows = x_ptr + tl.minimum(rows, n_rows - 1) * x_row_stride
    x = tl.load(x_rows + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, axis=1, keep_dims=True))
    y = e * (1.0 / tl.sum(e, axis=1, keep_dims=True))
    tl.store(y_ptr + rows * y_row_stride + cols, y.to(y_ptr.dtype.element_ty), mask=(rows < n_rows) & (cols < n_cols))


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
):
    """One CHUNK of one row per program, SPLIT programs per row (grid n_rows * SPLIT); GPU only.

    max_ptr, sum_ptr: (n_rows * SPLIT,) fp32 scratch. sync_ptr: (1 + n_rows,) int32 zeros; [0] hands out tickets,
    [1 + row] counts the chunks of a row that have published their (max, sum). Waiting for the rest of a row cannot
    deadlock: a program's work is its ticket, taken when it starts running, so the tickets taken are 0..T-1; every row
    but the last one begun has all its programs running, finishes, and frees room for the next tickets. It needs
    SPLIT programs to fit on the GPU at once: the caller keeps SPLIT <= the number of SMs.
    """
    ticket = tl.atomic_add(sync_ptr, 1).to(tl.int64)
    row = ticket // SPLIT
    cols = (ticket % SPLIT) * CHUNK + tl.arange(0, CHUNK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=float("-inf")).to(tl.float32)
    chunk_max = tl.max(x, axis=0)
    shift = tl.where(chunk_max == float("-inf"), 0.0, chunk_max)  # an all -inf chunk has sum 0, not NaN
    tl.store(max_ptr + ticket, chunk_max)
    tl.store(sum_ptr + ticket, tl.sum(tl.exp(x - shift), axis=0))
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
    inv_sum = 1.0 / tl.sum(sums * tl.exp(maxes - row_max), axis=0)
    y = tl.exp(x - row_max) * inv_sum
    tl.store(y_ptr + row * y_row_stride + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _forward_looped_kernel(x_ptr, y_ptr, n_cols, x_row_stride, y_row_stride, BLOCK: tl.constexpr):
    """One row per program in steps of BLOCK columns: online max and sum, then a second pass writes y."""
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_row_stride
    y_row = y_ptr + row * y_row_stride
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
        s = s * tl.exp(m - shift) + tl.exp(x - shift)
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
        tl.store(y_row + start + cols, (tl.exp(x - row_max) * inv_sum).to(y_ptr.dtype.element_ty), mask=mask)
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
):
    """dx = y * (dy - sum(dy * y)) for ROWS whole rows per program; all (n_rows, n_cols), unit column stride."""
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)[:, None]
    cols = tl.arange(0, BLOCK)[None, :]
    src = tl.minimum(rows, n_rows - 1)  # rows past the end read the last row again and are not stored
    y = tl.load(y_ptr + src * y_row_stride + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + src * dy_row_stride + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
    dx = y * (dy - tl.sum(y * dy, axis=1, keep_dims=True))
    tl.store(
        dx_ptr + rows * dx_row_stride + cols, dx.to(dx_ptr.dtype.element_ty), mask=(rows < n_rows) & (cols < n_cols)
    )


@triton.jit
def _backward_looped_kernel(
    y_ptr, dy_ptr, dx_ptr, n_cols, y_row_stride, dy_row_stride, dx_row_stride, BLOCK: tl.constexpr
):
    """dx = y * (dy - sum(dy * y)), one row per program in steps of BLOCK: a pass for the sum, a pass for dx."""
    row = tl.program_id(0).to(tl.int64)
    y_row = y_ptr + row * y_row_stride
    dy_row = dy_ptr + row * dy_row_stride
    dx_row = dx_ptr + row * dx_row_stride
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
    _forward_split_kernel,
    _forward_looped_kernel,
    _backward_rows_kernel,
    _backward_looped_kernel,
)


@dataclass(frozen=True)
class Plan:
    """How one launch covers the rows.

    kernel: "rows", "split" or "looped". block: columns per tile (rows: the padded row; split: one chunk; looped: one
    step). rows: rows per program (rows kernel). num_warps: warps per program.
    """

    kernel: str
    block: int
    rows: int = 1
    num_warps: int = 4


def _warps(block: int, itemsize: int) -> int:
    """Warps for a tile of `block` columns, as timed on the H200 (tune.py): 4 up to 2048 columns, then more with the
    bytes held (8 KiB: 8 warps; larger: 16; fp32 rows of 16384 or more: 32)."""
    if block <= 2048:
        return 4
    if block * itemsize <= 8192:
        return 8
    return 32 if itemsize == 4 and block >= 16384 else 16


def row_max(dtype: torch.dtype) -> int:
    """The widest row one program holds whole."""
    return ROW_MAX_BYTES // dtype.itemsize


def split_chunk(dtype: torch.dtype) -> int:
    """Columns per program in the split kernel."""
    return SPLIT_CHUNK[dtype.itemsize]


def _rows_plan(block: int, dtype: torch.dtype) -> Plan:
    rows = max(1, TILE_BYTES // (block * dtype.itemsize))
    return Plan("rows", block, rows, _warps(block, dtype.itemsize))


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def forward_plan(width: int, dtype: torch.dtype, device: torch.device) -> Plan:
    """The forward kernel for rows of `width` (see the module docstring)."""
    block = triton.next_power_of_2(width)
    if block <= row_max(dtype):
        return _rows_plan(block, dtype)
    chunk = split_chunk(dtype)
    split = triton.cdiv(width, chunk)
    if device.type == "cuda" and os.environ.get("TRITON_INTERPRET") != "1" and split <= _sm_count(device.index):
        return Plan("split", chunk, 1, _warps(chunk, dtype.itemsize))
    return Plan("looped", LOOP_BLOCK, 1, 8)


def backward_plan(width: int, dtype: torch.dtype) -> Plan:
    """The backward kernel for rows of `width`: whole rows up to BACKWARD_ROW_MAX, else looped."""
    block = triton.next_power_of_2(width)
    return _rows_plan(block, dtype) if block <= BACKWARD_ROW_MAX else Plan("looped", LOOP_BLOCK, 1, 8)


def _on(device: torch.device) -> contextlib.AbstractContextManager:
    """Launch on the tensor's GPU, not the current one."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def _ready(x: torch.Tensor) -> None:
    if x.device.type == "cpu" and (reason := triton_unavailable("cpu")):
        raise RuntimeError(f"softmax triton: {reason}")


def launch_forward(x: torch.Tensor, y: torch.Tensor, plan: Plan | None = None) -> None:
    """y = softmax(x) row by row. x, y: (rows, width), unit column stride; plan: None chooses (`forward_plan`)."""
    _ready(x)
    n_rows, n_cols = x.shape
    plan = plan or forward_plan(n_cols, x.dtype, x.device)
    with _on(x.device):
        if plan.kernel == "rows":
            _forward_rows_kernel[(triton.cdiv(n_rows, plan.rows),)](
                x, y, n_rows, n_cols, x.stride(0), y.stride(0), ROWS=plan.rows, BLOCK=plan.block,
                num_warps=plan.num_warps,
            )  # fmt: skip
        elif plan.kernel == "split":
            split = triton.cdiv(n_cols, plan.block)
            if x.is_cuda and split > _sm_count(x.device.index):  # all chunks of a row must fit on the GPU at once
                raise ValueError(
                    f"softmax triton: {split} chunks of {plan.block} per row > {_sm_count(x.device.index)} SMs"
                )
            stats = torch.empty(2, n_rows * split, dtype=torch.float32, device=x.device)
            sync = torch.zeros(1 + n_rows, dtype=torch.int32, device=x.device)
            _forward_split_kernel[(n_rows * split,)](
                x, y, stats[0], stats[1], sync, n_cols, x.stride(0), y.stride(0), SPLIT=split,
                SPLIT_P2=triton.next_power_of_2(split), CHUNK=plan.block, num_warps=plan.num_warps,
            )  # fmt: skip
        elif plan.kernel == "looped":
            _forward_looped_kernel[(n_rows,)](
                x, y, n_cols, x.stride(0), y.stride(0), BLOCK=plan.block, num_warps=plan.num_warps
            )
        else:
            raise ValueError(f"unknown softmax kernel {plan.kernel!r}; known: rows, split, looped")


def launch_backward(y: torch.Tensor, dy: torch.Tensor, dx: torch.Tensor, plan: Plan | None = None) -> None:
    """dx = y * (dy - sum(dy * y)) row by row. All (rows, width), unit column stride; plan: None chooses."""
    _ready(y)
    n_rows, n_cols = y.shape
    plan = plan or backward_plan(n_cols, y.dtype)
    strides = (y.stride(0), dy.stride(0), dx.stride(0))
    with _on(y.device):
        if plan.kernel == "rows":
            _backward_rows_kernel[(triton.cdiv(n_rows, plan.rows),)](
                y, dy, dx, n_rows, n_cols, *strides, ROWS=plan.rows, BLOCK=plan.block, num_warps=plan.num_warps
            )
        elif plan.kernel == "looped":
            _backward_looped_kernel[(n_rows,)](y, dy, dx, n_cols, *strides, BLOCK=plan.block, num_warps=plan.num_warps)
        else:
            raise ValueError(f"unknown softmax backward kernel {plan.kernel!r}; known: rows, looped")


DEVICES = ("cpu", "cuda")  # the CPU under TRITON_INTERPRET=1 only (slow: for tests)

softmax_triton_op = define_custom_ops("triton", launch_forward, launch_backward, DEVICES)


@SOFTMAX.impl("triton", devices=DEVICES, requires=triton_unavailable, backward=True)
def softmax_triton(x: torch.Tensor) -> torch.Tensor:
    """Triton, chosen by width: rows whole in registers (several short ones per program), a wide row split over
    programs that meet through global memory, or a looped online softmax. fp32 math, 64-bit row offsets."""
    return softmax_triton_op(x)
