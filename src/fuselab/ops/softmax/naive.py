"""Softmax in PyTorch: max, subtract, exp, sum, divide op by op (naive), torch.softmax (torch), and the naive
function under torch.compile (compile)."""

from __future__ import annotations

import torch

from fuselab.ops.backends import FLOAT_DTYPES
from fuselab.ops.softmax.spec import SOFTMAX

ANY_DEVICE = ("cpu", "cuda")


@SOFTMAX.impl("naive", devices=ANY_DEVICE, backward=True)
def softmax_naive(x: torch.Tensor) -> torch.Tensor:
    """Max, subtract, exp, sum, divide as separate PyTorch ops, in fp32: a kernel and a trip through memory each."""
    if x.numel() == 0:  # amax refuses an empty reduction; torch.softmax returns an empty tensor (clone: with grad_fn)
        return x.clone()
    x32 = x.float()
    e = torch.exp(x32 - x32.amax(dim=-1, keepdim=True))
    return (e / e.sum(dim=-1, keepdim=True)).to(x.dtype)


@SOFTMAX.impl("torch", devices=ANY_DEVICE, dtypes=(*FLOAT_DTYPES, torch.float64), backward=True, upstream=True)
def softmax_torch(x: torch.Tensor) -> torch.Tensor:
    """PyTorch's built-in torch.softmax over the last dimension (math in fp32 for fp16/bf16)."""
    return torch.softmax(x, dim=-1)


@SOFTMAX.impl("compile", devices=ANY_DEVICE, compiled=True, backward=True, upstream=True)
def softmax_compile(x: torch.Tensor) -> torch.Tensor:
    """The naive ops, which the harness wraps in torch.compile per case: Inductor fuses them into one kernel."""
    return softmax_naive(x)
