"""Softmax in CUDA C++: kernels and launchers in softmax.cu, torch binding in softmax_binding.cpp, built on first use.

Registered as impl "cuda" and, through the op factory (fuselab.ops.library), as ops fuselab::softmax_cuda /
fuselab::softmax_cuda_backward: schemas and fakes in Python, CUDA and AutogradCUDA kernels registered from C++
(TORCH_LIBRARY_IMPL in softmax_binding.cpp) when the extension loads. In eager mode a call goes to the binding's C++
entry (`fast`) first.

The kernels (a warp or fewer threads per short row; a block per span of a wider row, the spans of one row meeting
through a scratch buffer the binding keeps per stream; a looped online softmax past that; see softmax.cu) need no
torch headers, so
`nvcc -arch=sm_90 -c softmax.cu` checks them anywhere. The extension is built once per machine and cached in
~/.cache/fuselab/ext/fuselab_softmax (FUSELAB_EXT_DIR overrides); the first call takes a minute or so.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import torch

from fuselab.ops.backends import cuda_unavailable, load_cuda_extension
from fuselab.ops.softmax import _shared
from fuselab.ops.softmax.spec import SOFTMAX

CU_FILE: Path = Path(__file__).with_name("softmax.cu")
BINDING_FILE: Path = Path(__file__).with_name("softmax_binding.cpp")
_EXTENSION: list[ModuleType] = []


def extension() -> ModuleType:
    """The built extension: forward(x, y) and backward(y, dy, dx) on (rows, width) CUDA tensors, softmax(x) and
    softmax_backward(y, dy) on any shape. Loading it
    registers the CUDA kernels of fuselab::softmax_cuda and fuselab::softmax_cuda_backward."""
    if not _EXTENSION:
        _EXTENSION.append(load_cuda_extension("fuselab_softmax", (str(BINDING_FILE), str(CU_FILE))))
    return _EXTENSION[0]


def launch_forward(x: torch.Tensor, y: torch.Tensor) -> None:
    extension().forward(x, y)


def launch_backward(y: torch.Tensor, dy: torch.Tensor, dx: torch.Tensor) -> None:
    extension().backward(y, dy, dx)


DEVICES = ("cuda",)


def _forward(x: torch.Tensor) -> torch.Tensor:
    """y = softmax(x) over the last dimension, contiguous: one call into the binding (rows and output made in C++)."""
    return (_EXTENSION[0] if _EXTENSION else extension()).softmax(x)


def _backward(y: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """dx = y * (dy - sum(dy * y)) over the last dimension, contiguous."""
    return (_EXTENSION[0] if _EXTENSION else extension()).softmax_backward(y, dy)


def _forward_with_grad(x: torch.Tensor) -> torch.Tensor:
    """softmax(x) with its backward attached in C++ (the extension's torch::autograd::Function)."""
    return (_EXTENSION[0] if _EXTENSION else extension()).softmax_with_grad(x)


softmax_cuda = _shared.FAMILY.define(
    "softmax_cuda", _forward, _backward, DEVICES, kind="cuda", autograd=_forward_with_grad,
    fast=lambda: extension().fast,
)  # fmt: skip
SOFTMAX.impl(
    "cuda",
    devices=DEVICES,
    requires=cuda_unavailable,
    backward=True,
    cuda_source=CU_FILE,
    doc="CUDA C++: a warp (or fewer threads) per short row, a block per span of a wider row held in registers (few "
    "or wide rows cut into spans whose blocks meet), or a looped online softmax; 16-byte accesses between a row's "
    "edges, fp32 math, 64-bit indices.",
)(softmax_cuda)
