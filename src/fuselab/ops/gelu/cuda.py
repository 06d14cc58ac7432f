"""GELU as one fused CUDA C++ kernel (gelu.cu), built with torch.utils.cpp_extension on first use.

Registered as impl "cuda" and as custom ops fuselab::gelu_cuda / fuselab::gelu_cuda_backward. gelu.cu holds the
kernels and raw-pointer launchers with no torch headers (CI checks it with `nvcc -arch=sm_90 -c`);
gelu_binding.cpp is the thin torch side. The build (~1 min) is cached under ~/.cache/fuselab/ext/fuselab_gelu
(or $FUSELAB_EXT_DIR) and rebuilt only when a source changes.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import torch

from fuselab.ops.backends import cuda_unavailable, load_cuda_extension
from fuselab.ops.gelu.library import define_gelu_ops
from fuselab.ops.gelu.spec import GELU

CU_FILE: Path = Path(__file__).with_name("gelu.cu")
BINDING_FILE: Path = Path(__file__).with_name("gelu_binding.cpp")
DEVICES = ("cuda",)


def extension() -> ModuleType:
    """The compiled extension, with forward(x, tanh) and backward(dy, x, tanh); built on the first call."""
    return load_cuda_extension("fuselab_gelu", (str(BINDING_FILE), str(CU_FILE)))


def _forward(x: torch.Tensor, tanh: bool) -> torch.Tensor:
    return extension().forward(x.contiguous(), tanh)  # a copy for non-contiguous x (one read + write)


def _backward(grad: torch.Tensor, x: torch.Tensor, tanh: bool) -> torch.Tensor:
    return extension().backward(grad.contiguous(), x.contiguous(), tanh)


gelu_cuda_op = define_gelu_ops("cuda", _forward, _backward, DEVICES)


@GELU.impl("cuda", devices=DEVICES, requires=cuda_unavailable, backward=True)
def gelu_cuda(x: torch.Tensor, approximate: str = "tanh") -> torch.Tensor:
    """One fused CUDA C++ kernel: 16-byte vectors, 4 per thread in flight, fp32 math (ex2/rcp), 64-bit indices."""
    return gelu_cuda_op(x, approximate)
