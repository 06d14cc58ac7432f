"""Softmax with one element per thread, reduced through global memory: the design the row-per-program kernel avoids.

The lecture's question 5 asks why a softmax kernel gives a whole row to one block instead of one element to each
thread. This impl answers by measurement (`fuselab.ops.softmax.lecture`): each element is on its own, as in an
elementwise kernel (a program covers BLOCK consecutive elements of the flattened (rows, width) tensor, whatever rows
they fall in, and every element works out its row as index // width), so a row's max and sum can meet only in global
memory. Three launches:

1. ``row_max[row] = max(row_max[row], x)``: one fp32 atomic max per element into a per-row buffer (set to -inf);
2. ``row_sum[row] += exp(x - row_max[row])``: one fp64 atomic add per element into a per-row buffer (set to 0);
3. ``y = exp(x - row_max[row]) / row_sum[row]``.

The row sum is kept in fp64: atomic adds land in no fixed order, one term at a time, so an fp32 sum's rounding error
grows with the row's width (past 1e-5 relative from a few ten thousand elements); in fp64 it stays far under the
fp32 result's own rounding at any width.

It reads x three times and writes y once (4 · numel · itemsize bytes against the 2 of a fused kernel), gathers the
row statistics per element (3 loads that the caches mostly serve), and issues 2 atomics per element (4 B and 8 B),
every element of a row contending for the same address. Forward only (no backward). fp32 math; 64-bit indices. Under
TRITON_INTERPRET=1 it runs on the CPU (in fp32, for tests). A row that is all -inf, or holds +inf or NaN, gives
NaN as torch.softmax does (a NaN reaches the row's sum in step 2 even where the atomic max passes it by).
"""

from __future__ import annotations

import contextlib
import math

import torch
import triton
import triton.language as tl

from fuselab.ops.backends import triton_unavailable
from fuselab.ops.softmax._shared import as_rows, width_of
from fuselab.ops.softmax.spec import SOFTMAX

BLOCK = 1024  # elements per program: 4 per thread at 8 warps; the rows they fall in do not matter
NUM_WARPS = 8
DEVICES = ("cpu", "cuda")  # the CPU under TRITON_INTERPRET=1 only (slow: for tests)
ATOMICS_PER_ELEMENT = 2
ATOMIC_BYTES = 4 + 8  # the fp32 max and the fp64 sum
READS_OF_X = 3


@triton.jit
def _element_rows(n_elements, n_cols, BLOCK: tl.constexpr):
    """(row, column, mask) of each of this program's BLOCK elements of the flattened (rows, n_cols) tensor (64-bit)."""
    index = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = index < n_elements
    row = index // n_cols
    return row, index - row * n_cols, mask


@triton.jit
def _elementwise_max_kernel(x_ptr, max_ptr, n_elements, n_cols, x_row_stride, BLOCK: tl.constexpr):
    """row_max[row] = max over the row's elements, one atomic max per element. x: (rows, n_cols), unit column
    stride, any float dtype; max_ptr: (rows,) fp32, set to -inf."""
    row, col, mask = _element_rows(n_elements, n_cols, BLOCK)
    x = tl.load(x_ptr + row * x_row_stride + col, mask=mask).to(tl.float32)
    tl.atomic_max(max_ptr + row, x, mask=mask, sem="relaxed")


@triton.jit
def _elementwise_sum_kernel(x_ptr, max_ptr, sum_ptr, n_elements, n_cols, x_row_stride, BLOCK: tl.constexpr):
    """row_sum[row] += exp(x - row_max[row]), one atomic add per element. sum_ptr: (rows,) fp64, set to 0."""
    row, col, mask = _element_rows(n_elements, n_cols, BLOCK)
    x = tl.load(x_ptr + row * x_row_stride + col, mask=mask).to(tl.float32)
    row_max = tl.load(max_ptr + row, mask=mask)
    tl.atomic_add(sum_ptr + row, tl.exp(x - row_max).to(tl.float64), mask=mask, sem="relaxed")


@triton.jit
def _elementwise_write_kernel(
    x_ptr, y_ptr, max_ptr, sum_ptr, n_elements, n_cols, x_row_stride, y_row_stride, BLOCK: tl.constexpr
):
    """y = exp(x - row_max[row]) / row_sum[row]; y: (rows, n_cols), unit column stride, x's dtype."""
    row, col, mask = _element_rows(n_elements, n_cols, BLOCK)
    x = tl.load(x_ptr + row * x_row_stride + col, mask=mask).to(tl.float32)
    row_max = tl.load(max_ptr + row, mask=mask)
    row_sum = tl.load(sum_ptr + row, mask=mask, other=1.0).to(tl.float32)
    y = tl.exp(x - row_max) / row_sum
    tl.store(y_ptr + row * y_row_stride + col, y.to(y_ptr.dtype.element_ty), mask=mask)


TRITON_KERNELS = (_elementwise_max_kernel, _elementwise_sum_kernel, _elementwise_write_kernel)


def bytes_issued(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    """The bytes this impl asks of memory for one call: x read READS_OF_X times and y written once (numel ·
    itemsize each), plus ATOMICS_PER_ELEMENT atomics per element (ATOMIC_BYTES in all, executed in L2). The
    per-row statistics it gathers per element (3 loads) are left out: the caches serve them."""
    numel = math.prod(shape)
    return (READS_OF_X + 1) * numel * dtype.itemsize + ATOMIC_BYTES * numel


def launch(x: torch.Tensor, y: torch.Tensor) -> None:
    """y = softmax of each row of x. x, y: (rows, width), unit column stride, rows >= 1, width >= 1."""
    if x.device.type == "cpu" and (reason := triton_unavailable("cpu")):
        raise ValueError(f"softmax triton-elementwise: input is on cpu; move it with .to('cuda'). {reason}")
    n_rows, n_cols = x.shape
    n_elements = n_rows * n_cols
    row_max = torch.full((n_rows,), float("-inf"), dtype=torch.float32, device=x.device)
    row_sum = torch.zeros(n_rows, dtype=torch.float64, device=x.device)
    grid = (triton.cdiv(n_elements, BLOCK),)
    meta = {"BLOCK": BLOCK, "num_warps": NUM_WARPS}
    with torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext():
        _elementwise_max_kernel[grid](x, row_max, n_elements, n_cols, x.stride(0), **meta)
        _elementwise_sum_kernel[grid](x, row_max, row_sum, n_elements, n_cols, x.stride(0), **meta)
        _elementwise_write_kernel[grid](x, y, row_max, row_sum, n_elements, n_cols, x.stride(0), y.stride(0), **meta)


@SOFTMAX.impl(
    "triton-elementwise",
    devices=DEVICES,
    requires=triton_unavailable,
    backward=False,
    triton_kernels=lambda: TRITON_KERNELS,
)
def softmax_triton_elementwise(x: torch.Tensor) -> torch.Tensor:
    """Triton, one element per thread: a row's max and sum meet in global memory through 2 atomics per element
    (3 launches, x read 3 times). Forward only; the lecture's counter-example to the row-per-program kernel."""
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.numel():
        launch(as_rows(x), y.view(-1, width_of(y)))
    return y
