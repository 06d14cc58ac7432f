"""GELU as one fused Triton kernel (forward and backward), registered as impl "triton" and as custom ops
fuselab::gelu_triton / fuselab::gelu_triton_backward. The kernels live in triton_kernels.py, imported on first
use so that importing fuselab needs no Triton; `TRITON_KERNELS` is re-exported from there.
"""

from __future__ import annotations

from types import ModuleType

import torch

from fuselab.ops.backends import triton_unavailable
from fuselab.ops.gelu.library import define_gelu_ops
from fuselab.ops.gelu.spec import GELU

DEVICES = ("cpu", "cuda")  # the CPU under TRITON_INTERPRET=1 only (slow: for tests)


def _kernels() -> ModuleType:
    """triton_kernels, imported on first use."""
    from fuselab.ops.gelu import triton_kernels

    return triton_kernels


def _ready(x: torch.Tensor) -> None:
    """On the CPU, raise ValueError unless Triton's interpreter is on."""
    if x.device.type == "cpu" and (reason := triton_unavailable("cpu")):
        raise ValueError(f"gelu triton: input is on cpu; move it with .to('cuda'). {reason}")


def _forward(x: torch.Tensor, tanh: bool) -> torch.Tensor:
    _ready(x)
    return _kernels().gelu_forward(x, tanh)


def _backward(grad: torch.Tensor, x: torch.Tensor, tanh: bool) -> torch.Tensor:
    _ready(x)
    return _kernels().gelu_backward(grad, x, tanh)


gelu_triton_op = define_gelu_ops("triton", _forward, _backward, DEVICES)


@GELU.impl(
    "triton",
    devices=DEVICES,
    requires=triton_unavailable,
    backward=True,
    triton_kernels=lambda: _kernels().TRITON_KERNELS,
)
def gelu_triton(x: torch.Tensor, approximate: str = "tanh") -> torch.Tensor:
    """One fused Triton kernel: 4 KiB per program, fp32 math, 64-bit offsets; backward fused too."""
    return gelu_triton_op(x, approximate)


def __getattr__(name: str) -> object:
    if name == "TRITON_KERNELS":
        return _kernels().TRITON_KERNELS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
