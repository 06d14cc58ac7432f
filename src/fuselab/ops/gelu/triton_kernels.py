"""GELU forward and backward as fused Triton kernels (imported lazily: only this module needs Triton).

One program handles BLOCK elements of one row (plans.py: block_bytes of input, warps by element size; the figures
behind them are in docs/ops/gelu.md). A contiguous tensor is one flat row; a tensor with unit inner stride but other
row strides (a slice x[:, :k]) is read in place row by row; other layouts are copied first (`as_rows`). Programs
whose block lies inside the row run unmasked, so loads are 16-byte vectors whatever the element count (Triton
specializes integers on divisibility by 16: a mask `offs < n` with an n that is not loses the vectors); only the last
block of a row is masked. Offsets are 64-bit (program_id cast first), so tensors may pass 2^31 elements. Math is in
fp32. The tanh form is written with exp2 (works under the interpreter, one MUFU.EX2 on the GPU):
    0.5 * x * (1 + tanh(u)) = x * sigmoid(2u) = x / (1 + exp(-2u)),   u = sqrt(2/pi) * (x + 0.044715 x^3)
which gives F.gelu's special values by itself: x = +inf -> inf / 1 = inf, x = -inf -> -inf / inf = NaN.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

from fuselab.ops import tuning
from fuselab.ops.gelu import plans
from fuselab.ops.gelu.spec import KAPPA, SQRT1_2, SQRT_2_OVER_PI
from fuselab.ops.library import on_device, wrap_triton

# exp(-2u) = exp2(x * (C0 + C1 * x^2))
C0: tl.constexpr = tl.constexpr(-2.0 * math.log2(math.e) * SQRT_2_OVER_PI)
C1: tl.constexpr = tl.constexpr(-2.0 * math.log2(math.e) * SQRT_2_OVER_PI * KAPPA)
# d/dx of the tanh form: s * (1 + (1 - s) * x * (D0 + D1 * x^2)), s = sigmoid(2u)
D0: tl.constexpr = tl.constexpr(2.0 * SQRT_2_OVER_PI)
D1: tl.constexpr = tl.constexpr(6.0 * SQRT_2_OVER_PI * KAPPA)
HALF_SQRT: tl.constexpr = tl.constexpr(SQRT1_2)
INV_SQRT_2PI: tl.constexpr = tl.constexpr(1.0 / math.sqrt(2.0 * math.pi))
NEG_HALF_LOG2E: tl.constexpr = tl.constexpr(-0.5 * math.log2(math.e))


@triton.jit
def _gelu(x, TANH: tl.constexpr):
    """GELU of fp32 x, elementwise."""
    if TANH:  # noqa: SIM108  (a constexpr branch: only one side is compiled)
        y = x / (1.0 + tl.exp2(x * (C0 + C1 * x * x)))
    else:
        y = 0.5 * x * (1.0 + tl.erf(x * HALF_SQRT))
    return y


@triton.jit
def _gelu_grad(x, TANH: tl.constexpr):
    """dGELU/dx of fp32 x, elementwise."""
    if TANH:
        s = 1.0 / (1.0 + tl.exp2(x * (C0 + C1 * x * x)))
        g = s * (1.0 + (1.0 - s) * x * (D0 + D1 * x * x))
    else:
        g = 0.5 * (1.0 + tl.erf(x * HALF_SQRT)) + x * INV_SQRT_2PI * tl.exp2(NEG_HALF_LOG2E * x * x)
    return g


@triton.jit
def _block(pid, n_cols, row_stride, blocks_per_row, BLOCK: tl.constexpr, STRIDED: tl.constexpr):
    """(offset of this program's row in x, its offset in the contiguous output, first column) for program `pid`.

    STRIDED: x is (rows, n_cols) with unit column stride and row stride `row_stride`, blocks_per_row programs per
    row; else x is flat (one row of n_cols elements), and the row offsets are the constant 0, so the compiler still
    sees every program's start as a multiple of BLOCK (16-byte vectors).
    """
    if STRIDED:
        row = pid // blocks_per_row
        return row * row_stride, row * n_cols, (pid - row * blocks_per_row) * BLOCK
    else:
        return 0, 0, pid * BLOCK


@triton.jit
def gelu_forward_kernel(
    x_ptr, y_ptr, n_cols, x_row_stride, blocks_per_row, TANH: tl.constexpr, BLOCK: tl.constexpr, STRIDED: tl.constexpr
):
    """y = gelu(x). x: n_cols elements, or (STRIDED) rows of n_cols with row stride x_row_stride and unit column
    stride; y: the same elements, contiguous. Programs whose BLOCK lies inside the row load and store without a mask
    (16-byte vectors whatever n_cols is); only the last block of a row is masked."""
    x_off, y_off, start = _block(tl.program_id(0).to(tl.int64), n_cols, x_row_stride, blocks_per_row, BLOCK, STRIDED)
    cols = start + tl.arange(0, BLOCK)
    x_ptr += x_off
    y_ptr += y_off
    if start + BLOCK <= n_cols:  # the bulk
        x = tl.load(x_ptr + cols).to(tl.float32)
        tl.store(y_ptr + cols, _gelu(x, TANH).to(y_ptr.dtype.element_ty))
    else:  # the ragged tail
        mask = cols < n_cols
        x = tl.load(x_ptr + cols, mask=mask).to(tl.float32)
        tl.store(y_ptr + cols, _gelu(x, TANH).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def gelu_backward_kernel(
    dy_ptr,
    x_ptr,
    dx_ptr,
    n_cols,
    dy_row_stride,
    x_row_stride,
    blocks_per_row,
    TANH: tl.constexpr,
    BLOCK: tl.constexpr,
    STRIDED: tl.constexpr,
):
    """dx = dy * gelu'(x). dy, x: as x of gelu_forward_kernel, each with its own row stride; dx contiguous."""
    pid = tl.program_id(0).to(tl.int64)
    dy_off, dx_off, start = _block(pid, n_cols, dy_row_stride, blocks_per_row, BLOCK, STRIDED)
    x_off, _, _ = _block(pid, n_cols, x_row_stride, blocks_per_row, BLOCK, STRIDED)
    cols = start + tl.arange(0, BLOCK)
    dy_ptr += dy_off
    x_ptr += x_off
    dx_ptr += dx_off
    if start + BLOCK <= n_cols:
        dy = tl.load(dy_ptr + cols).to(tl.float32)
        x = tl.load(x_ptr + cols).to(tl.float32)
        tl.store(dx_ptr + cols, (dy * _gelu_grad(x, TANH)).to(dx_ptr.dtype.element_ty))
    else:
        mask = cols < n_cols
        dy = tl.load(dy_ptr + cols, mask=mask).to(tl.float32)
        x = tl.load(x_ptr + cols, mask=mask).to(tl.float32)
        tl.store(dx_ptr + cols, (dy * _gelu_grad(x, TANH)).to(dx_ptr.dtype.element_ty), mask=mask)


TRITON_KERNELS = (gelu_forward_kernel, gelu_backward_kernel)


def launch_config(dtype: torch.dtype, device: int | None = None) -> tuple[int, int]:
    """(BLOCK elements per program, num_warps) for `dtype` on CUDA device `device` (None: the current one, or the
    defaults without a GPU): from that GPU's plan table (plans/), else the rule. Cached per (dtype, device): the table
    is read once, not per call."""
    if device is None and torch.cuda.is_available():
        device = torch.cuda.current_device()
    return _launch_config(dtype.itemsize, device)


@functools.lru_cache(maxsize=64)
def _launch_config(itemsize: int, device: int | None) -> tuple[int, int]:
    return plans.gelu_config(itemsize, tuning.device_key(device) if device is not None else None)


tuning.on_table_written(_launch_config.cache_clear)  # made from the plan table: made again when one is written


def as_rows(t: torch.Tensor) -> torch.Tensor:
    """t as a (rows, cols) view with unit column stride (any row stride), copying only when there is none: a
    transposed or stepped last dimension, or leading dimensions that do not merge, cost one extra read and write."""
    cols = t.shape[-1] if t.dim() else 1
    if cols > 1 and t.stride(-1) != 1:
        t = t.contiguous()
    try:
        return t.view(-1, cols) if t.dim() else t.view(1, 1)
    except RuntimeError:
        return t.contiguous().view(-1, cols)


def _launch(
    kernel: triton.JITFunction, *tensors: torch.Tensor, tanh: bool, config: tuple[int, int] | None = None
) -> torch.Tensor:
    """Run `kernel` over inputs `tensors` (same shape; any strides) into a new contiguous tensor; return it.

    Contiguous inputs are one flat row, passed as they are; others are read as rows through their row strides
    (`as_rows`). config: (BLOCK, num_warps) instead of `launch_config`'s (the tuner's candidates)."""
    x = tensors[0]
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    n = out.numel()
    if n == 0:
        return out
    block, num_warps = config or _CONFIGS.get((x.dtype, x.get_device())) or _config(x)
    if all(t.is_contiguous() for t in tensors):
        views, n_rows, n_cols, strided = tensors, 1, n, False
    else:
        views = [as_rows(t) for t in tensors]
        n_rows, n_cols = views[0].shape
        strided = n_rows > 1
    per_row = (n_cols + block - 1) // block
    strides = [v.stride(0) if strided else n_cols for v in views]
    with on_device(out):
        wrap_triton(kernel)[(n_rows * per_row,)](
            *views, out, n_cols, *strides, per_row, TANH=tanh, BLOCK=block, STRIDED=strided, num_warps=num_warps
        )
    return out


_CONFIGS: dict[tuple[torch.dtype, int], tuple[int, int]] = {}  # (dtype, device index or -1) -> launch_config


def _config(x: torch.Tensor) -> tuple[int, int]:
    """launch_config for x's dtype and device, remembered in _CONFIGS (looked up on every call)."""
    device = x.get_device()
    found = _CONFIGS[(x.dtype, device)] = launch_config(x.dtype, device if x.is_cuda else None)
    return found


def gelu_forward(x: torch.Tensor, tanh: bool, config: tuple[int, int] | None = None) -> torch.Tensor:
    """GELU of x (any shape and strides): a new contiguous tensor, same shape and dtype. config: see `_launch`."""
    return _launch(gelu_forward_kernel, x, tanh=tanh, config=config)


def gelu_backward(dy: torch.Tensor, x: torch.Tensor, tanh: bool) -> torch.Tensor:
    """dy * GELU'(x); dy, x of the same shape and dtype, any strides; a new contiguous tensor."""
    return _launch(gelu_backward_kernel, dy, x, tanh=tanh)
