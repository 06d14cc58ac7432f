"""What the Triton and CUDA C++ softmax share: the (rows, width) view of a tensor and the torch custom ops."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from fuselab.ops.backends import check_matches, check_tensor

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
    if width > 1 and x.stride(-1) != 1:
        x = x.contiguous()
    try:
        return x.view(-1, width)
    except RuntimeError:
        return x.contiguous().view(-1, width)


def define_custom_ops(
    backend: str, forward: ForwardLaunch, backward: BackwardLaunch, devices: Sequence[str]
) -> Callable[[torch.Tensor], torch.Tensor]:
    """Register `fuselab::softmax_<backend>(Tensor x) -> Tensor` and `fuselab::softmax_<backend>_backward(Tensor y,
    Tensor dy) -> Tensor`, joined by register_autograd; return a function calling the differentiable op.

    The ops are opaque to torch.compile: it calls their fake impls (shape, dtype, device; outputs are contiguous)
    instead of the kernels, so a model using them compiles with fullgraph=True. Inputs are checked in the ops and in
    their fake impls, so bad input fails while tracing too.
    """
    name = f"softmax {backend}"
    devices = tuple(devices)

    def check(x: torch.Tensor) -> None:
        check_tensor(x, impl=name, devices=devices)

    def check_grad(y: torch.Tensor, dy: torch.Tensor) -> None:
        check(y)
        check_tensor(dy, impl=f"{name} backward", devices=devices)
        check_matches(dy, y, impl=f"{name} backward", names=("dy", "y"))

    def like(x: torch.Tensor) -> torch.Tensor:
        return torch.empty(x.shape, dtype=x.dtype, device=x.device)

    @torch.library.custom_op(f"fuselab::softmax_{backend}", mutates_args=())
    def softmax_op(x: torch.Tensor) -> torch.Tensor:
        check(x)
        y = like(x)
        if x.numel():
            forward(as_rows(x), y.view(-1, width_of(y)))
        return y

    @softmax_op.register_fake
    def _(x: torch.Tensor) -> torch.Tensor:
        check(x)
        return like(x)

    @torch.library.custom_op(f"fuselab::softmax_{backend}_backward", mutates_args=())
    def softmax_backward_op(y: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
        check_grad(y, dy)
        dx = like(y)
        if y.numel():
            backward(as_rows(y), as_rows(dy), dx.view(-1, width_of(dx)))
        return dx

    @softmax_backward_op.register_fake
    def _(y: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
        check_grad(y, dy)
        return like(y)

    def setup_context(ctx: torch.autograd.function.FunctionCtx, inputs: tuple, output: torch.Tensor) -> None:
        ctx.save_for_backward(output)  # dx needs y only: y * (dy - sum(dy * y))

    def backward_fn(ctx: torch.autograd.function.FunctionCtx, dy: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        return softmax_backward_op(y, dy)

    softmax_op.register_autograd(backward_fn, setup_context=setup_context)

    def softmax(x: torch.Tensor) -> torch.Tensor:
        check(x)  # before the op's own schema check, whose message for a non-tensor is cryptic
        return softmax_op(x)

    return softmax
