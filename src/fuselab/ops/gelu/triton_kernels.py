"""GELU forward and backward as fused Triton kernels (imported lazily: only this module needs Triton).

One program handles BLOCK elements (plans.py: block_bytes of input, warps by element size; the figures behind them are
in docs/ops/gelu.md). The output is laid out as torch.empty_like lays it out (as F.gelu's): a dense input (contiguous,
transposed, permuted) keeps its strides, and input and output are then one flat row in memory order; other layouts
(a slice x[:, :k], a stride through 1-D, an input strided unlike the other) are read in place as rows through their
strides, in tiles of as many whole rows as fit (`_launch_rows`), into a contiguous output. Flat programs whose block
lies inside the tensor run unmasked, so loads are 16-byte vectors whatever the element count (Triton specializes
integers on divisibility by 16: a mask `offs < n` with an n that is not loses the vectors); only the last block is
masked. Offsets are 64-bit (program_id cast first), so tensors may pass 2^31 elements. Math is in
fp32. The tanh form is written with exp2 (works under the interpreter, one MUFU.EX2 on the GPU):
    0.5 * x * (1 + tanh(u)) = x * sigmoid(2u) = x / (1 + exp(-2u)),   u = sqrt(2/pi) * (x + 0.044715 x^3)
which gives F.gelu's special values by itself: x = +inf -> inf / 1 = inf, x = -inf -> -inf / inf = NaN.
"""

from __future__ import annotations

import functools
import itertools
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
def gelu_forward_kernel(x_ptr, y_ptr, n, TANH: tl.constexpr, BLOCK: tl.constexpr):
    """y = gelu(x) over n elements in memory order. Programs whose BLOCK lies inside n load and store without a mask
    (16-byte vectors whatever n is); only the last block is masked."""
    start = tl.program_id(0).to(tl.int64) * BLOCK
    offs = start + tl.arange(0, BLOCK)
    if start + BLOCK <= n:  # the bulk
        x = tl.load(x_ptr + offs).to(tl.float32)
        tl.store(y_ptr + offs, _gelu(x, TANH).to(y_ptr.dtype.element_ty))
    else:  # the ragged tail
        _gelu_tile(x_ptr + offs, y_ptr + offs, offs < n, TANH)


@triton.jit
def gelu_backward_kernel(dy_ptr, x_ptr, dx_ptr, n, TANH: tl.constexpr, BLOCK: tl.constexpr):
    """dx = dy * gelu'(x) over n elements in memory order, as gelu_forward_kernel."""
    start = tl.program_id(0).to(tl.int64) * BLOCK
    offs = start + tl.arange(0, BLOCK)
    if start + BLOCK <= n:
        dy = tl.load(dy_ptr + offs).to(tl.float32)
        x = tl.load(x_ptr + offs).to(tl.float32)
        tl.store(dx_ptr + offs, (dy * _gelu_grad(x, TANH)).to(dx_ptr.dtype.element_ty))
    else:
        _grad_tile(dy_ptr + offs, x_ptr + offs, dx_ptr + offs, offs < n, TANH)


@triton.jit
def _tile(n_cols, tiles_per_row, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """(rows (BLOCK_R, 1), columns (1, BLOCK_C), whether the columns lie inside the row) of this program's tile."""
    pid = tl.program_id(0).to(tl.int64)
    tile_row = pid // tiles_per_row
    first = (pid - tile_row * tiles_per_row) * BLOCK_C
    rows = tile_row * BLOCK_R + tl.arange(0, BLOCK_R)[:, None]
    return rows, first + tl.arange(0, BLOCK_C)[None, :], first + BLOCK_C <= n_cols


@triton.jit
def _gelu_tile(x_at, y_at, mask, TANH: tl.constexpr):
    x = tl.load(x_at, mask=mask).to(tl.float32)
    tl.store(y_at, _gelu(x, TANH).to(y_at.dtype.element_ty), mask=mask)


@triton.jit
def _grad_tile(dy_at, x_at, dx_at, mask, TANH: tl.constexpr):
    dy = tl.load(dy_at, mask=mask).to(tl.float32)
    x = tl.load(x_at, mask=mask).to(tl.float32)
    tl.store(dx_at, (dy * _gelu_grad(x, TANH)).to(dx_at.dtype.element_ty), mask=mask)


@triton.jit
def gelu_forward_rows_kernel(
    x_ptr,
    y_ptr,
    n_rows,
    n_cols,
    x_row_stride,
    x_col_stride,
    tiles_per_row,
    TANH: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """y = gelu(x); x: (n_rows, n_cols) of any strides, y: (n_rows, n_cols) contiguous. A program takes a tile of
    BLOCK_R rows x BLOCK_C columns (many short rows, or a part of one long row); tiles inside their rows' columns
    are masked by row only, so their loads stay vectors where the strides allow."""
    rows, cols, inside = _tile(n_cols, tiles_per_row, BLOCK_R, BLOCK_C)
    x_at = x_ptr + rows * x_row_stride + cols * x_col_stride
    y_at = y_ptr + rows * n_cols + cols
    if inside:
        _gelu_tile(x_at, y_at, rows < n_rows, TANH)
    else:
        _gelu_tile(x_at, y_at, (rows < n_rows) & (cols < n_cols), TANH)


@triton.jit
def gelu_backward_rows_kernel(
    dy_ptr,
    x_ptr,
    dx_ptr,
    n_rows,
    n_cols,
    dy_row_stride,
    dy_col_stride,
    x_row_stride,
    x_col_stride,
    tiles_per_row,
    TANH: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """dx = dy * gelu'(x); dy, x: (n_rows, n_cols), each of its own strides; dx contiguous; tiles as forward's."""
    rows, cols, inside = _tile(n_cols, tiles_per_row, BLOCK_R, BLOCK_C)
    dy_at = dy_ptr + rows * dy_row_stride + cols * dy_col_stride
    x_at = x_ptr + rows * x_row_stride + cols * x_col_stride
    dx_at = dx_ptr + rows * n_cols + cols
    if inside:
        _grad_tile(dy_at, x_at, dx_at, rows < n_rows, TANH)
    else:
        _grad_tile(dy_at, x_at, dx_at, (rows < n_rows) & (cols < n_cols), TANH)


TRITON_KERNELS = (gelu_forward_kernel, gelu_backward_kernel, gelu_forward_rows_kernel, gelu_backward_rows_kernel)


def launch_config(dtype: torch.dtype, device: int | None = None) -> tuple[int, int]:
    """(BLOCK elements per program, num_warps) for `dtype` on CUDA device `device` (None: the current one, or the
    defaults without a GPU; under `tuning.planning_as`, that GPU's): from that GPU's plan table (plans/), else the
    rule. Cached per (dtype, device): the table is read once, not per call."""
    model = tuning.planning_for()
    if model is not None:
        return plans.gelu_config(dtype.itemsize, model.key)
    if device is None and torch.cuda.is_available():
        device = torch.cuda.current_device()
    return _launch_config(dtype.itemsize, device)


@functools.lru_cache(maxsize=64)
def _launch_config(itemsize: int, device: int | None) -> tuple[int, int]:
    return plans.gelu_config(itemsize, tuning.reading_key(plans.FOLDER, device) if device is not None else None)


tuning.on_table_written(_launch_config.cache_clear)  # made from the plan table: made again when one is written


def layout_order(t: torch.Tensor) -> list[int]:
    """t's dimensions from the largest stride to the smallest (ties in their order): t.permute(order) is contiguous
    where t is dense (a transpose, a permutation), and so is it for every tensor torch.empty_like(t) makes."""
    return sorted(range(t.dim()), key=lambda d: -t.stride(d))


def rows_view(t: torch.Tensor) -> tuple[int, int, int, int] | None:
    """(rows, columns, row stride, column stride) of t read as rows of its last dimension, strides in elements; None
    where its leading dimensions do not merge into rows of one stride."""
    if t.dim() == 0:
        return 1, 1, 0, 1
    lead = [(size, stride) for size, stride in zip(t.shape[:-1], t.stride()[:-1], strict=True) if size != 1]
    if any(outer != inner * size for (_, outer), (size, inner) in itertools.pairwise(lead)):
        return None
    return math.prod(size for size, _ in lead), t.shape[-1], lead[-1][1] if lead else 0, t.stride(-1)


def _launch(
    kernels: tuple[triton.JITFunction, triton.JITFunction],
    *tensors: torch.Tensor,
    tanh: bool,
    config: tuple[int, int] | None = None,
) -> torch.Tensor:
    """Run kernels (flat, rows) over inputs `tensors` (same shape, any strides, x last) into a new tensor laid out
    as torch.empty_like(x) lays it (x's strides where x is dense, else contiguous); return it.

    Inputs whose memory order is the output's (contiguous, or all transposed alike) go to the flat kernel; others
    to the rows kernel, read in place through their strides (copied only when their leading dimensions do not
    merge). config: (BLOCK, num_warps) instead of `launch_config`'s (the tuner's candidates)."""
    x = tensors[-1]
    out = torch.empty_like(x)
    n = out.numel()
    if n == 0:
        return out
    block, num_warps = config or _CONFIGS.get((x.dtype, x.get_device())) or _config(x)
    flat, rows = kernels
    written = out
    if not (out.is_contiguous() and all(t.is_contiguous() for t in tensors)):
        order = layout_order(out)
        written, tensors = out.permute(order), tuple(t.permute(order) for t in tensors)
        if not all(t.is_contiguous() for t in tensors):
            _launch_rows(rows, tensors, written, tanh, block, num_warps)
            return out
    with on_device(out):
        wrap_triton(flat)[(triton.cdiv(n, block),)](*tensors, written, n, TANH=tanh, BLOCK=block, num_warps=num_warps)
    return out


def _launch_rows(
    kernel: triton.JITFunction,
    tensors: tuple[torch.Tensor, ...],
    out: torch.Tensor,
    tanh: bool,
    block: int,
    num_warps: int,
) -> None:
    """kernel over tensors seen as rows (`rows_view`) into contiguous out: tiles of `block` elements, as many whole
    rows as fit (the columns rounded up to a power of two) or a part of one row."""
    views = []
    for t in tensors:
        view = rows_view(t)
        if view is None:
            t = t.contiguous()
            view = rows_view(t)
        views.append((t, view))
    n_rows, n_cols = views[0][1][:2]
    block_c = min(triton.next_power_of_2(int(n_cols)), block)  # a constexpr: a symbolic width is fixed here
    per_row = triton.cdiv(n_cols, block_c)
    grid = (triton.cdiv(n_rows, block // block_c) * per_row,)
    strides = [stride for _, view in views for stride in view[2:]]
    with on_device(out):
        wrap_triton(kernel)[grid](
            *(t for t, _ in views), out, n_rows, n_cols, *strides, per_row,
            TANH=tanh, BLOCK_R=block // block_c, BLOCK_C=block_c, num_warps=num_warps,
        )  # fmt: skip


_CONFIGS: dict[tuple[torch.dtype, int], tuple[int, int]] = {}  # (dtype, device index or -1) -> launch_config
tuning.on_table_written(_CONFIGS.clear)  # (and on entering and leaving tuning.planning_as)


def _config(x: torch.Tensor) -> tuple[int, int]:
    """launch_config for x's dtype and device, remembered in _CONFIGS (looked up on every call)."""
    device = x.get_device()
    found = _CONFIGS[(x.dtype, device)] = launch_config(x.dtype, device if x.is_cuda else None)
    return found


def gelu_forward(x: torch.Tensor, tanh: bool, config: tuple[int, int] | None = None) -> torch.Tensor:
    """GELU of x (any shape and strides): a new tensor of x's shape, dtype and layout (`_launch`). config: see
    `_launch`."""
    return _launch((gelu_forward_kernel, gelu_forward_rows_kernel), x, tanh=tanh, config=config)


def gelu_backward(dy: torch.Tensor, x: torch.Tensor, tanh: bool) -> torch.Tensor:
    """dy * GELU'(x); dy, x of the same shape and dtype, any strides; a new tensor laid out as x (`_launch`)."""
    return _launch((gelu_backward_kernel, gelu_backward_rows_kernel), dy, x, tanh=tanh)
