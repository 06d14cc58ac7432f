"""GELU in PyTorch: the formula op by op (naive), F.gelu (torch), and the formula under torch.compile (compile)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fuselab.ops.backends import FLOAT_DTYPES
from fuselab.ops.gelu.spec import GELU, KAPPA, SQRT1_2, SQRT_2_OVER_PI, check_form

ANY_DEVICE = ("cpu", "cuda")


def formula(x: torch.Tensor, approximate: str) -> torch.Tensor:
    """GELU's formula in PyTorch ops, in x's dtype; x and approximate as the impls below have checked them."""
    if approximate == "tanh":
        return 0.5 * x * (1.0 + torch.tanh(SQRT_2_OVER_PI * (x + KAPPA * x * x * x)))
    return 0.5 * x * (1.0 + torch.erf(x * SQRT1_2))


# tolerance_scale: the tanh form rounds 9 times in the dtype forward and as many backward, F.gelu once each way;
# on 17 fp16 elements its error is twice F.gelu's at the median and ~7x in the tail (docs/gate.md).
@GELU.impl("naive", devices=ANY_DEVICE, backward=True, tolerance_scale=3.0)
def gelu_naive(x: torch.Tensor, approximate: str = "tanh") -> torch.Tensor:
    """The formula as separate PyTorch ops in x's dtype: one kernel and one trip through memory per op."""
    check_form(approximate)
    return formula(x, approximate)


@GELU.impl("torch", devices=ANY_DEVICE, dtypes=(*FLOAT_DTYPES, torch.float64), backward=True, upstream=True)
def gelu_torch(x: torch.Tensor, approximate: str = "tanh") -> torch.Tensor:
    """PyTorch's built-in F.gelu: one fused kernel (math in fp32 for fp16/bf16). Also what fuselab.nn.GELU() (impl
    "auto") runs while torch.compile traces it (the op's `traced_impl`): Inductor then sees the graph
    torch.nn.GELU gives it, and fuses it alike (docs/call-cost.md)."""
    check_form(approximate)
    return F.gelu(x, approximate=approximate)


@GELU.impl(
    "compile", devices=ANY_DEVICE, dtypes=(*FLOAT_DTYPES, torch.float64), compiled=True, backward=True, upstream=True
)
def gelu_compile(x: torch.Tensor, approximate: str = "tanh") -> torch.Tensor:
    """The naive formula, which the harness wraps in torch.compile per case: Inductor fuses it into one kernel. It
    calls the formula itself, not the naive impl, whose input check would add its guards to every compiled call."""
    check_form(approximate)
    return formula(x, approximate)
