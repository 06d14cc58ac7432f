"""`Softmax` as a torch.nn.Module over any registered implementation."""

from __future__ import annotations

import torch

from fuselab.ops.registry import UnknownName
from fuselab.ops.softmax.spec import SOFTMAX


class Softmax(torch.nn.Module):
    """Softmax over the last dimension, computed by the implementation `impl` (a name registered on SOFTMAX).

    impl: "triton" (default), "cuda", "torch", "naive" or "compile" (naive under torch.compile). Input (..., width);
    output the same shape and dtype. Triton and CUDA have their own backward kernels.
    """

    def __init__(self, impl: str = "triton") -> None:
        super().__init__()
        self.impl = impl
        try:
            found = SOFTMAX.get_impl(impl)
        except UnknownName as e:
            raise ValueError(str(e)) from None
        self._fn = torch.compile(found.fn) if found.compiled else found.fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._fn(x)

    def extra_repr(self) -> str:
        return f"impl={self.impl!r}"
