"""What GELU's fused impls (triton, cuda) give the op factory (fuselab.ops.library): the input check and the fakes.

Both ops are fuselab::gelu_<backend>(Tensor x, str approximate) -> Tensor and
fuselab::gelu_<backend>_backward(Tensor dy, Tensor x, str approximate) -> Tensor. Outputs are laid out as
torch.empty_like(x) lays them out (as F.gelu's: x's strides where x is dense, else contiguous).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from fuselab.ops.backends import check_matches, check_tensor, checked_inputs
from fuselab.ops.gelu.spec import FORMS, check_form
from fuselab.ops.library import OpFamily


def make_check(name: str, devices: Sequence[str]) -> Callable[[torch.Tensor, str], None]:
    """check(x, approximate): a clear error for a non-tensor, a device or dtype the impl lacks, an unknown form."""

    def check(x: torch.Tensor, approximate: str) -> None:
        if approximate not in FORMS:
            check_form(approximate)

    return checked_inputs(check, impl=name, names=("x",), devices=devices)


def fake(x: torch.Tensor, approximate: str) -> torch.Tensor:
    """y: x's shape, dtype and layout."""
    return torch.empty_like(x)


def make_backward_check(name: str, devices: Sequence[str]) -> Callable[[torch.Tensor, torch.Tensor, str], None]:
    """check(dy, x, approximate) for the backward op: x as forward's, dy of x's shape, dtype and device."""
    check = make_check(name, devices)

    def backward_check(dy: torch.Tensor, x: torch.Tensor, approximate: str) -> None:
        check(x, approximate)
        check_tensor(dy, impl=f"{name} backward", devices=tuple(devices), name="dy")
        check_matches(dy, x, impl=f"{name} backward", names=("dy", "x"))

    return backward_check


def backward_fake(dy: torch.Tensor, x: torch.Tensor, approximate: str) -> torch.Tensor:
    """dx: x's shape, dtype and layout."""
    return torch.empty_like(x)


FAMILY = OpFamily(
    fake=fake,
    backward_fake=backward_fake,
    checks=lambda name, devices: (make_check(name, devices), make_backward_check(name, devices)),
)
