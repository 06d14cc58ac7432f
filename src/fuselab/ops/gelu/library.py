"""GELU kernels as PyTorch custom ops (torch.library), with fake tensors and autograd.

`define_gelu_ops("triton", ...)` registers
    fuselab::gelu_triton(Tensor x, str approximate) -> Tensor
    fuselab::gelu_triton_backward(Tensor grad, Tensor x, str approximate) -> Tensor
and joins them with register_autograd, so gradients flow and torch.compile traces a model using them as single
opaque nodes (no graph break): the fake impls give the output's shape, dtype and strides without running a kernel.
Outputs are contiguous; inputs are passed as they are (each backend reads strides or copies, and says which).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from fuselab.ops.backends import check_matches, check_tensor
from fuselab.ops.gelu.spec import check_form

Forward = Callable[[torch.Tensor, bool], torch.Tensor]  # (x, tanh form?) -> contiguous y
Backward = Callable[[torch.Tensor, torch.Tensor, bool], torch.Tensor]  # (grad, x, tanh?) -> contiguous dx


def define_gelu_ops(
    backend: str, forward: Forward, backward: Backward, devices: Sequence[str]
) -> Callable[[torch.Tensor, str], torch.Tensor]:
    """Register fuselab::gelu_<backend> (+ _backward) on `forward`/`backward`; return a function calling the
    differentiable op after checking its input."""
    name = f"gelu {backend}"
    devices = tuple(devices)

    def check(x: torch.Tensor, approximate: str) -> None:
        check_tensor(x, impl=name, devices=devices)
        check_form(approximate)

    def check_grad(grad: torch.Tensor, x: torch.Tensor) -> None:
        check_tensor(grad, impl=f"{name} backward", devices=devices)
        check_matches(grad, x, impl=f"{name} backward", names=("grad", "x"))

    def like(x: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(x, memory_format=torch.contiguous_format)

    @torch.library.custom_op(f"fuselab::gelu_{backend}", mutates_args=())
    def gelu_op(x: torch.Tensor, approximate: str) -> torch.Tensor:
        check(x, approximate)
        return forward(x, approximate == "tanh")

    @gelu_op.register_fake
    def _(x: torch.Tensor, approximate: str) -> torch.Tensor:
        check(x, approximate)
        return like(x)

    @torch.library.custom_op(f"fuselab::gelu_{backend}_backward", mutates_args=())
    def gelu_backward_op(grad: torch.Tensor, x: torch.Tensor, approximate: str) -> torch.Tensor:
        check(x, approximate)
        check_grad(grad, x)
        return backward(grad, x, approximate == "tanh")

    @gelu_backward_op.register_fake
    def _(grad: torch.Tensor, x: torch.Tensor, approximate: str) -> torch.Tensor:
        check(x, approximate)
        check_grad(grad, x)
        return like(x)

    def setup_context(ctx: torch.autograd.function.FunctionCtx, inputs: tuple, output: torch.Tensor) -> None:
        x, approximate = inputs
        ctx.save_for_backward(x)
        ctx.approximate = approximate

    def backward_fn(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (x,) = ctx.saved_tensors
        return gelu_backward_op(grad, x, ctx.approximate), None

    gelu_op.register_autograd(backward_fn, setup_context=setup_context)

    def gelu(x: torch.Tensor, approximate: str = "tanh") -> torch.Tensor:
        check(x, approximate)  # before the op's own schema check, whose message for a non-tensor is cryptic
        return gelu_op(x, approximate)

    return gelu
