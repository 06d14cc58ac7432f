"""A tiny Triton kernel for the inspect tests: y = 2 x, one block of BLOCK elements per program."""

import torch
import triton
import triton.language as tl


@triton.jit
def _twice(x):
    return x + x


@triton.jit
def scale_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, _twice(tl.load(x_ptr + offs, mask=mask)), mask=mask)


def scale(x: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    n = x.numel()
    scale_kernel[(triton.cdiv(n, 1024),)](x, y, n, BLOCK=1024)
    return y


@triton.jit
def row_max_kernel(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    """out[row] = max(x[row, :]): uses tl.max, itself a @jit function of triton.language."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * n_cols + cols, mask=cols < n_cols, other=float("-inf"))
    tl.store(out_ptr + row, tl.max(x, axis=0))


def row_max(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty(x.shape[0], dtype=x.dtype, device=x.device)
    row_max_kernel[(x.shape[0],)](x, out, x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]))
    return out


TRITON_KERNELS = (scale_kernel, row_max_kernel)
