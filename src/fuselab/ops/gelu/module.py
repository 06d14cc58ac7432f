"""fuselab.nn.GELU: a drop-in for torch.nn.GELU that runs any registered GELU implementation."""

from __future__ import annotations

import torch

from fuselab.ops.gelu.spec import GELU as GELU_OP
from fuselab.ops.gelu.spec import check_form
from fuselab.ops.registry import UnknownName


class GELU(torch.nn.Module):
    """y = GELU(x) elementwise, any shape; torch.nn.GELU's signature and default (approximate="none", the erf form),
    computed by implementation `impl` (keyword only).

    impl: a registered GELU impl (naive, torch, compile, triton, cuda); "compile" is wrapped in torch.compile here.
    triton and cuda have fused backward kernels; naive, torch and compile differentiate through PyTorch.
    Dtypes: float32, float16, bfloat16; impl="torch" also float64.
    """

    def __init__(self, approximate: str = "none", *, impl: str = "triton") -> None:
        super().__init__()
        check_form(approximate)
        try:
            found = GELU_OP.get_impl(impl)
        except UnknownName as e:
            raise ValueError(str(e)) from None
        self.approximate = approximate
        self.impl = impl
        self._fn = torch.compile(found.fn) if found.compiled else found.fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._fn(x, self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}, impl={self.impl!r}"

    @classmethod
    def drop_in_pair(cls, impl: str, approximate: str = "tanh") -> tuple[torch.nn.Module, torch.nn.Module]:
        """(this module running `impl`, torch.nn.GELU), both for the op's option `approximate`: what the contract
        test (tests/ops/test_contract.py) puts in the same model and compares."""
        return cls(approximate, impl=impl), torch.nn.GELU(approximate=approximate)


__all__ = ["GELU"]  # what fuselab.nn exposes of this op
