"""Softmax in plain PyTorch: the unfused baseline, the built-in, and torch.compile of the baseline."""

from __future__ import annotations

import torch

from fuselab.ops.softmax.spec import SOFTMAX


@SOFTMAX.impl("naive", backward=True)
def naive(x: torch.Tensor) -> torch.Tensor:
    """Max, subtract, exp, sum, divide as separate PyTorch ops (each a kernel reading and writing memory).

    x: (..., width) float tensor; returns the same shape and dtype, math in fp32.
    """
    if x.numel() == 0:  # amax refuses an empty reduction; torch.softmax returns an empty tensor
        return torch.empty_like(x)
    x32 = x.float()
    shifted = x32 - x32.amax(dim=-1, keepdim=True)
    e = torch.exp(shifted)
    return (e / e.sum(dim=-1, keepdim=True)).to(x.dtype)


@SOFTMAX.impl("torch", backward=True)
def torch_softmax(x: torch.Tensor) -> torch.Tensor:
    """torch.softmax over the last dimension (PyTorch's own fused kernels)."""
    return torch.softmax(x, dim=-1)


# The harness wraps `compiled` impls in torch.compile once per case (and reports compile time apart).
SOFTMAX.impl("compile", compiled=True, backward=True)(naive)
