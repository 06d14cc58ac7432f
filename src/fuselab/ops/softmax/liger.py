"""Liger-Kernel's Triton softmax (`liger_kernel.ops.softmax`, 0.8), registered as impl "liger": the library users
would pick instead of ours, so the draws time it beside them (`Defaults.rivals`).

Liger gives each row one program holding the whole row (a block of the next power of 2, warps by width) and refuses
rows wider than 65 536 columns. It is imported on first use (its package imports take seconds) and is "unavailable",
saying why, where it is not installed.
"""

from __future__ import annotations

import importlib.util

import torch

from fuselab.ops.backends import triton_unavailable
from fuselab.ops.softmax.spec import SOFTMAX


def liger_unavailable(device_type: str) -> str | None:
    """None when Liger-Kernel's softmax can run on `device_type` here, else why not."""
    if importlib.util.find_spec("liger_kernel") is None:
        return "Liger-Kernel is not installed (pip install liger-kernel)"
    return triton_unavailable(device_type)


@SOFTMAX.impl("liger", devices=("cuda",), requires=liger_unavailable, backward=True, upstream=True)
def softmax_liger(x: torch.Tensor) -> torch.Tensor:
    """Liger-Kernel's LigerSoftmaxFunction: one program per row, the row whole in registers (at most 65 536 wide)."""
    from liger_kernel.ops.softmax import LigerSoftmaxFunction

    return LigerSoftmaxFunction.apply(x)
