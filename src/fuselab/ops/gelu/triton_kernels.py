"""GELU forward and backward as fused Triton kernels (imported lazily: only this module needs Triton).

One program handles BLOCK contiguous elements: 4 KiB of input (1024 fp32 or 2048 fp16/bf16), one 16-byte vector per
thread at 8 warps in fp32, two at 4 warps in 16 bits; 2^28 fp32 elements make 2^18 programs. On the H200 (reading L2
flush, benchmarks/results/h200/logs/gelu_blocks.log) these moved 4084-4292 GB/s in fp32 at 2^24-2^28 (0.975-0.998x
F.gelu) against 3953-4115 for 16 KiB at 8 warps (1.007-1.030x); bf16 3666-4251 against 3399-4177. Offsets are
64-bit (program_id cast first), so tensors may pass 2^31 elements. Math is in fp32. The tanh form is written with
exp2 (works under the interpreter, one MUFU.EX2 on the GPU):
    0.5 * x * (1 + tanh(u)) = x * sigmoid(2u) = x / (1 + exp(-2u)),   u = sqrt(2/pi) * (x + 0.044715 x^3)
which gives F.gelu's special values by itself: x = +inf -> inf / 1 = inf, x = -inf -> -inf / inf = NaN.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from fuselab.ops.gelu.spec import KAPPA, SQRT1_2, SQRT_2_OVER_PI
from fuselab.ops.library import on_device, wrap_triton

BLOCK_BYTES = 4096  # input bytes per program
NUM_WARPS = {4: 8, 2: 4}  # by element size

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
    """y[i] = gelu(x[i]) for i < n. x, y: contiguous, n elements, same dtype (fp32/fp16/bf16)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    tl.store(y_ptr + offs, _gelu(x, TANH).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def gelu_backward_kernel(dy_ptr, x_ptr, dx_ptr, n, TANH: tl.constexpr, BLOCK: tl.constexpr):
    """dx[i] = dy[i] * gelu'(x[i]) for i < n. dy, x, dx: contiguous, n elements, same dtype."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    dy = tl.load(dy_ptr + offs, mask=mask).to(tl.float32)
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    tl.store(dx_ptr + offs, (dy * _gelu_grad(x, TANH)).to(dx_ptr.dtype.element_ty), mask=mask)


TRITON_KERNELS = (gelu_forward_kernel, gelu_backward_kernel)


def launch_config(dtype: torch.dtype) -> tuple[int, int]:
    """(BLOCK elements per program, num_warps) for `dtype`."""
    return BLOCK_BYTES // dtype.itemsize, NUM_WARPS[dtype.itemsize]


def _launch(kernel: triton.JITFunction, *tensors: torch.Tensor, tanh: bool) -> torch.Tensor:
    """Run `kernel` over inputs `tensors` (contiguous, same shape) into a new tensor; return it."""
    out = torch.empty_like(tensors[0])
    n = out.numel()
    if n == 0:
        return out
    block, num_warps = launch_config(out.dtype)
    with on_device(out):
        wrap_triton(kernel)[(triton.cdiv(n, block),)](*tensors, out, n, TANH=tanh, BLOCK=block, num_warps=num_warps)
    return out


def gelu_forward(x: torch.Tensor, tanh: bool) -> torch.Tensor:
    """GELU of x (any shape; copied first unless contiguous), same shape and dtype, contiguous."""
    return _launch(gelu_forward_kernel, x.contiguous(), tanh=tanh)


def gelu_backward(dy: torch.Tensor, x: torch.Tensor, tanh: bool) -> torch.Tensor:
    """dy * GELU'(x); dy, x of the same shape and dtype (copied first unless contiguous); contiguous."""
    return _launch(gelu_backward_kernel, dy.contiguous(), x.contiguous(), tanh=tanh)
