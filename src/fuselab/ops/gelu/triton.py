"""GELU as one fused Triton kernel (forward and backward), registered as impl "triton" and, through the op factory
(fuselab.ops.library), as triton ops fuselab::gelu_triton / fuselab::gelu_triton_backward. The kernels live in
triton_kernels.py, imported on first use so that importing fuselab needs no Triton; `TRITON_KERNELS` is re-exported
from there.
"""

from __future__ import annotations

from types import ModuleType

import torch

from fuselab.ops.backends import triton_unavailable
from fuselab.ops.gelu import fused
from fuselab.ops.gelu.spec import GELU

DEVICES = ("cpu", "cuda")  # the CPU under TRITON_INTERPRET=1 only (slow: for tests)
_KERNELS: list[ModuleType] = []


def _kernels() -> ModuleType:
    """triton_kernels, imported on first use."""
    if not _KERNELS:
        from fuselab.ops.gelu import triton_kernels

        _KERNELS.append(triton_kernels)
    return _KERNELS[0]


def _ready(x: torch.Tensor) -> None:
    """On the CPU, raise ValueError unless Triton's interpreter is on."""
    if not x.is_cuda and (reason := triton_unavailable("cpu")):
        raise ValueError(f"gelu triton: input is on cpu; move it with .to('cuda'). {reason}")


def forward(x: torch.Tensor, approximate: str) -> torch.Tensor:
    """y = gelu(x), laid out as torch.empty_like(x) (any layout of x: the launcher reads strides)."""
    if not x.is_cuda:
        _ready(x)
    return (_KERNELS[0] if _KERNELS else _kernels()).gelu_forward(x, approximate == "tanh")


def backward(dy: torch.Tensor, x: torch.Tensor, approximate: str) -> torch.Tensor:
    """dx = dy * gelu'(x), laid out as torch.empty_like(x)."""
    if not x.is_cuda:
        _ready(x)
    return (_KERNELS[0] if _KERNELS else _kernels()).gelu_backward(dy, x, approximate == "tanh")


gelu_triton = fused.FAMILY.define(
    "gelu_triton", forward, backward, DEVICES, kind="triton", defaults={"approximate": "tanh"}, replay=True
)  # replay: forward allocates y with empty_like and writes it with its kernel alone
GELU.impl(
    "triton",
    devices=DEVICES,
    requires=triton_unavailable,
    backward=True,
    triton_kernels=lambda: _kernels().TRITON_KERNELS,
    doc="One fused Triton kernel: 4 KiB per program, fp32 math, 64-bit offsets; backward fused too.",
)(gelu_triton)


def __getattr__(name: str) -> object:
    if name == "TRITON_KERNELS":
        return _kernels().TRITON_KERNELS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
