"""Attention as Triton kernels (impl "triton"): the custom ops fuselab::attention_triton_fwd/_bwd (torch.library
triton_op, so torch.compile(fullgraph=True) traces through them), the CS336 autograd Function FlashAttentionTriton,
and the registration. The kernels live in triton_kernels.py, imported on first use so importing fuselab needs no Triton.
"""

from __future__ import annotations

from types import ModuleType

import torch

from fuselab.ops.attention.spec import ATTENTION, check_qkv, default_scale, flash_function
from fuselab.ops.backends import triton_unavailable

DEVICES = ("cpu", "cuda")  # the CPU under TRITON_INTERPRET=1 only (slow: for tests)


def _kernels() -> ModuleType:
    from fuselab.ops.attention import triton_kernels

    return triton_kernels


def _ready(q: torch.Tensor) -> None:
    """On the CPU, raise ValueError unless Triton's interpreter is on."""
    if q.device.type == "cpu" and (reason := triton_unavailable("cpu")):
        raise ValueError(f"attention triton: input is on cpu; move it with .to('cuda'). {reason}")


def _define_ops() -> tuple[object, object]:
    """fuselab::attention_triton_fwd(q, k, v, causal, scale) -> (o, lse) and
    fuselab::attention_triton_bwd(do, q, k, v, o, lse, causal, scale) -> (dq, dk, dv), joined by register_autograd."""
    import os

    from torch.library import custom_op, triton_op

    # triton_op lets torch.compile see (and Inductor launch) the kernels; under the CPU interpreter its tracing would
    # run the kernels on fake tensors, so there the ops are opaque custom ops (same schema, autograd and fakes).
    define = custom_op if os.environ.get("TRITON_INTERPRET") == "1" else triton_op

    @define("fuselab::attention_triton_fwd", mutates_args=())
    def fwd_op(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return _kernels().forward(q, k, v, causal, scale)

    @define("fuselab::attention_triton_bwd", mutates_args=())
    def bwd_op(
        do: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        o: torch.Tensor,
        lse: torch.Tensor,
        causal: bool,
        scale: float,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return _kernels().backward(do, q, k, v, o, lse, causal, scale)

    def setup_context(ctx: torch.autograd.function.FunctionCtx, inputs: tuple, output: tuple) -> None:
        q, k, v, causal, scale = inputs
        o, lse = output
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.scale = causal, scale

    def backward(ctx: torch.autograd.function.FunctionCtx, do: torch.Tensor, _dlse: torch.Tensor | None) -> tuple:
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = bwd_op(do, q, k, v, o, lse, ctx.causal, ctx.scale)
        return dq, dk, dv, None, None

    if define is custom_op:  # fake impls (shapes only), which custom_op needs; triton_op derives them by tracing

        @fwd_op.register_fake
        def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float) -> tuple:
            return q.new_empty(q.shape), q.new_empty(q.shape[:-1], dtype=torch.float32)

        @bwd_op.register_fake
        def _(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *rest: object) -> tuple:
            return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)

    fwd_op.register_autograd(backward, setup_context=setup_context)
    return fwd_op, bwd_op


# Defined at import (torch.compile must not trace their definition); the kernels themselves load on first call.
FWD_OP, BWD_OP = _define_ops()


def attention_triton_op(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, scale: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(O, L) through the differentiable custom op, after checking the inputs."""
    check_qkv(q, k, v, impl="attention triton", devices=DEVICES)
    _ready(q)
    return FWD_OP(q, k, v, bool(causal), default_scale(q.shape[-1], scale))


def _checked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    check_qkv(q, k, v, impl="FlashAttentionTriton", devices=DEVICES)
    _ready(q)


FlashAttentionTriton = flash_function(
    "FlashAttentionTriton",
    lambda *args: _kernels().forward(*args),
    lambda *args: _kernels().backward(*args),
    check=_checked,
)


@ATTENTION.impl(
    "triton",
    devices=DEVICES,
    requires=triton_unavailable,
    backward=True,
    triton_kernels=lambda: _kernels().TRITON_KERNELS,
)
def attention_triton(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, scale: float | None = None
) -> torch.Tensor:
    """FlashAttention-2 in Triton: fused forward (online softmax, logsumexp), deterministic backward (dK/dV per key
    block, dQ per query block), causal block skipping, GQA, any d up to 256 padded in-kernel, any strides."""
    return attention_triton_op(q, k, v, causal, scale)[0]


def __getattr__(name: str) -> object:
    if name == "TRITON_KERNELS":
        return _kernels().TRITON_KERNELS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
