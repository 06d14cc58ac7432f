"""What the Triton and CUDA C++ softmax share: the (rows, width) view of a tensor, and what they give the op factory
(fuselab.ops.library): forward/backward around a row launcher, the input check and the fakes.

Both ops are fuselab::softmax_<backend>(Tensor x) -> Tensor and fuselab::softmax_<backend>_backward(Tensor y,
Tensor dy) -> Tensor. Outputs are contiguous.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from fuselab.ops.backends import check_matches, check_tensor, input_check
from fuselab.ops.library import OpFamily

# launch(x, y): y = softmax of each row of x; both (rows, width) with unit column stride, rows >= 1, width >= 1.
ForwardLaunch = Callable[[torch.Tensor, torch.Tensor], None]
# launch(y, dy, dx): dx = y * (dy - sum(dy * y)) row by row; all (rows, width) with unit column stride.
BackwardLaunch = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None]


def width_of(x: torch.Tensor) -> int:
    """Length of the softmax dimension (a 0-d tensor is one row of one element)."""
    return x.shape[-1] if x.dim() else 1


def as_rows(x: torch.Tensor) -> torch.Tensor:
    """x (..., width) as a (rows, width) view with unit stride along the width, copying only when none exists.

    Kernels take each row's start from a row stride, so sliced rows (x[:, :k]) or broadcast rows need no copy. A last
    dimension that is not contiguous (x.t(), an expanded gradient) or leading dimensions that do not merge into one
    stride (x[:, :k, :]) are copied with .contiguous(): correct, at the cost of one extra read and write.
    """
    width = width_of(x)
    if x.dim() == 2 and (width <= 1 or x.stride(1) == 1):
        return x  # already (rows, width)
    if width > 1 and x.stride(-1) != 1:
        x = x.contiguous()
    try:
        return x.view(-1, width)
    except RuntimeError:
        return x.contiguous().view(-1, width)


def _empty(x: torch.Tensor) -> torch.Tensor:
    """An uninitialized contiguous tensor like x (empty_like: a third of torch.empty(shape, ...)'s host cost)."""
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def row_functions(
    forward: ForwardLaunch, backward: BackwardLaunch
) -> tuple[Callable[[torch.Tensor], torch.Tensor], Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]:
    """(forward(x) -> y, backward(y, dy) -> dx) over tensors of any shape, allocating the contiguous output and
    handing the row launchers (rows, width) views."""

    def softmax_forward(x: torch.Tensor) -> torch.Tensor:
        y = _empty(x)
        if x.numel():
            forward(as_rows(x), y.view(-1, width_of(y)))
        return y

    def softmax_backward(y: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
        dx = _empty(y)
        if y.numel():
            backward(as_rows(y), as_rows(dy), dx.view(-1, width_of(dx)))
        return dx

    return softmax_forward, softmax_backward


def make_checks(
    name: str, devices: Sequence[str]
) -> tuple[Callable[[torch.Tensor], None], Callable[[torch.Tensor, torch.Tensor], None]]:
    """(check(x), backward_check(y, dy)): clear errors for a non-tensor, a device or dtype the impl lacks, or a dy
    that does not match y."""
    devices = tuple(devices)
    check = input_check(impl=name, names=("x",), devices=devices)

    def backward_check(y: torch.Tensor, dy: torch.Tensor) -> None:
        check(y)
        check_tensor(dy, impl=f"{name} backward", devices=devices, name="dy")
        check_matches(dy, y, impl=f"{name} backward", names=("dy", "y"))

    return check, backward_check


def fake(x: torch.Tensor) -> torch.Tensor:
    """y: x's shape and dtype, contiguous."""
    return _empty(x)


def backward_fake(y: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """dx: y's shape and dtype, contiguous."""
    return _empty(y)


FAMILY = OpFamily(fake=fake, backward_fake=backward_fake, checks=make_checks)
