"""fuselab.nn.GELU: a drop-in for torch.nn.GELU that runs any registered GELU implementation."""

from __future__ import annotations

import torch

from fuselab.ops.gelu.spec import GELU as GELU_OP
from fuselab.ops.gelu.spec import check_form


class GELU(torch.nn.Module):
    """y = GELU(x) elementwise, any shape; torch.nn.GELU's signature and default (approximate="none", the erf form),
    computed by implementation `impl` (keyword only).

    impl: "auto" (default: the fused Triton kernel on a GPU, PyTorch's F.gelu on the CPU, where Triton only interprets,
    `Op.native_impl`; while torch.compile traces it, F.gelu, which Inductor fuses into the kernels around it as it does
    torch.nn.GELU) or a registered GELU impl (naive, torch, compile, triton, cuda), which runs eager and compiled alike;
    "compile" is wrapped in torch.compile here. triton and cuda have fused backward kernels; naive, torch and compile
    differentiate through PyTorch. Dtypes: float32, float16, bfloat16; impl="torch" and "compile" also float64.
    """

    def __init__(self, approximate: str = "none", *, impl: str = "auto") -> None:
        super().__init__()
        check_form(approximate)
        self.approximate = approximate
        self.impl = impl
        self._drop_in = GELU_OP.drop_in(impl)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fn = self._drop_in.pick(x)
        return fn(x, self.approximate)

    def extra_repr(self) -> str:
        chosen = f" ({self._drop_in.describe()})" if self.impl == "auto" else ""
        return f"approximate={self.approximate!r}, impl={self.impl!r}{chosen}"

    @classmethod
    def drop_in_pair(cls, impl: str, approximate: str = "tanh") -> tuple[torch.nn.Module, torch.nn.Module]:
        """(this module running `impl`, torch.nn.GELU), both for the op's option `approximate`: what the contract
        test (tests/ops/test_contract.py) puts in the same model and compares."""
        return cls(approximate, impl=impl), torch.nn.GELU(approximate=approximate)


__all__ = ["GELU"]  # what fuselab.nn exposes of this op
