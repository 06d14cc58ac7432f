"""What the Triton and CUDA C++ softmax share: the (rows, width) view of a tensor and the torch custom ops."""

from __future__ import annotations

from collections.abc import Callable

import torch

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


def define_custom_ops(backend: str, forward: ForwardLaunch, backward: BackwardLaunch) -> Callable:
    """Register `fuselab::softmax_<backend>` and `fuselab::softmax_<backend>_backward` with autograd.

    The custom ops are opaque to torch.compile (it calls them, with fake tensors for shapes), so a model using them
    compiles with fullgraph=True. Returns the forward op: (..., width) tensor -> new contiguous tensor, same shape.
    """

    def softmax_fwd(x: torch.Tensor) -> torch.Tensor:
        y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        if x.numel():
            forward(as_rows(x), y.view(-1, width_of(y)))
        return y

    def softmax_bwd(y: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
        if dy.shape != y.shape:
            raise ValueError(f"softmax_{backend} backward: gradient shape {tuple(dy.shape)} != {tuple(y.shape)}")
        dx = torch.empty(y.shape, dtype=y.dtype, device=y.device)
        if y.numel():
            backward(as_rows(y), as_rows(dy.to(y.dtype)), dx.view(-1, width_of(dx)))
        return dx

    fwd = torch.library.custom_op(f"fuselab::softmax_{backend}", softmax_fwd, mutates_args=())
    bwd = torch.library.custom_op(f"fuselab::softmax_{backend}_backward", softmax_bwd, mutates_args=())

    @fwd.register_fake
    def _(x: torch.Tensor) -> torch.Tensor:
        return torch.empty(x.shape, dtype=x.dtype, device=x.device)

    @bwd.register_fake
    def _(y: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
        return torch.empty(y.shape, dtype=y.dtype, device=y.device)

    def setup_context(ctx: object, inputs: tuple[torch.Tensor], output: torch.Tensor) -> None:
        ctx.save_for_backward(output)

    def grad(ctx: object, dy: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        return bwd(y, dy)

    fwd.register_autograd(grad, setup_context=setup_context)
    return fwd
