"""GELU as one fused CUDA C++ kernel (gelu.cu), built with torch.utils.cpp_extension on first use.

Registered as impl "cuda" and, through the op factory (fuselab.ops.library), as ops fuselab::gelu_cuda /
fuselab::gelu_cuda_backward: their schemas and fakes are Python; their CUDA and AutogradCUDA kernels are registered
from C++ (TORCH_LIBRARY_IMPL in gelu_binding.cpp) when the extension loads, so torch.compile's code and autograd reach
the kernel without Python in between. In eager mode a call goes to the binding's C++ entry (`fast`) first. gelu.cu
holds the kernels and raw-pointer launchers with no torch headers (CI checks it with `nvcc -arch=sm_90 -c`);
gelu_binding.cpp is the thin torch side. The build (~1 min) is cached under ~/.cache/fuselab/ext/fuselab_gelu (or
$FUSELAB_EXT_DIR) and rebuilt only when a source changes.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import torch

from fuselab.ops.backends import cuda_unavailable, load_cuda_extension
from fuselab.ops.gelu import fused
from fuselab.ops.gelu.spec import GELU

CU_FILE: Path = Path(__file__).with_name("gelu.cu")
BINDING_FILE: Path = Path(__file__).with_name("gelu_binding.cpp")
DEVICES = ("cuda",)
_EXTENSION: list[ModuleType] = []


def extension() -> ModuleType:
    """The compiled extension, with forward(x, tanh) and backward(dy, x, tanh); built on the first call. Loading it
    registers the CUDA kernels of fuselab::gelu_cuda and fuselab::gelu_cuda_backward."""
    if not _EXTENSION:
        _EXTENSION.append(load_cuda_extension("fuselab_gelu", (str(BINDING_FILE), str(CU_FILE))))
    return _EXTENSION[0]


def forward(x: torch.Tensor, approximate: str) -> torch.Tensor:
    """y = gelu(x), laid out as torch.empty_like(x) (any layout of x: the binding reads strides)."""
    ext = _EXTENSION[0] if _EXTENSION else extension()
    return ext.forward(x, approximate == "tanh")


def backward(dy: torch.Tensor, x: torch.Tensor, approximate: str) -> torch.Tensor:
    """dx = dy * gelu'(x), laid out as torch.empty_like(x)."""
    ext = _EXTENSION[0] if _EXTENSION else extension()
    return ext.backward(dy, x, approximate == "tanh")


def forward_with_grad(x: torch.Tensor, approximate: str) -> torch.Tensor:
    """y = gelu(x) with its backward attached in C++ (the extension's torch::autograd::Function)."""
    return (_EXTENSION[0] if _EXTENSION else extension()).forward_with_grad(x, approximate == "tanh")


gelu_cuda = fused.FAMILY.define(
    "gelu_cuda", forward, backward, DEVICES, kind="cuda", defaults={"approximate": "tanh"}, autograd=forward_with_grad,
    fast=lambda: extension().fast,
)  # fmt: skip
GELU.impl(
    "cuda",
    devices=DEVICES,
    requires=cuda_unavailable,
    backward=True,
    cuda_source=CU_FILE,
    doc="One fused CUDA C++ kernel: 16-byte vectors, 4 per thread in flight, fp32 math (ex2/rcp), 64-bit indices.",
)(gelu_cuda)
