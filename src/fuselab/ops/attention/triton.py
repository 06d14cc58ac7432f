"""Attention as Triton kernels (impl "triton"): the custom ops fuselab::attention_triton and _backward (from
fuselab.ops.library's factory, with an eager path that skips the dispatcher), the CS336 autograd Function
FlashAttentionTriton, and the registration. The kernels live in triton_kernels.py, imported on first use so importing
fuselab needs no Triton.

The ops are opaque to torch.compile (kind "python", not a triton_op that it traces into): the forward's launch builds
TMA descriptors on the host, which torch's tracing of Triton launches does not take (torch 2.11 ran such a traced
launch on wrong arguments). Under torch.compile(fullgraph=True) each op is one node of the graph, replayed from C as
eager calls are; FlashAttentionTriton calls the ops while torch.compile traces it.

Eager calls and the graph's are replayed (define_op's `replay`): after the first call of a key (the tensors' layouts,
the options), forward (O and the logsumexp) and backward (dQ, dK, dV; its scratch, delta and the split partials, kept as
`fuselab.ops.launcher.workspace`s) are each one call into C, the TMA descriptors encoded there. A call whose backward
must copy (a broadcast gradient, another dtype) or zero-fill (causal keys no query sees) runs its Python each time.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import torch

from fuselab.ops.attention.spec import ATTENTION, QKV_RANK, check_qkv, default_scale, flash_function
from fuselab.ops.backends import FLOAT_DTYPES, input_check, triton_unavailable
from fuselab.ops.library import define_op

DEVICES = ("cpu", "cuda")  # the CPU under TRITON_INTERPRET=1 only (slow: for tests)
# The kernels' dtypes: not float64, which the other impls take (tl.dot of float64 tiles will not accumulate in fp32;
# until 2026-12-05 a float64 input reached the kernel and failed there with an AssertionError)
KERNEL_DTYPES = FLOAT_DTYPES


def _kernels() -> ModuleType:
    from fuselab.ops.attention import triton_kernels

    return triton_kernels


def _ready(q: torch.Tensor) -> None:
    """On the CPU, raise ValueError unless Triton's interpreter is on."""
    if q.device.type == "cpu" and (reason := triton_unavailable("cpu")):
        raise ValueError(f"attention triton: input is on cpu; move it with .to('cuda'). {reason}")


def forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(O like q, L: logsumexp of each query's scores, fp32, q.shape[:-1]); scale None: 1/sqrt(d)."""
    return _kernels().forward(q, k, v, causal, default_scale(q.shape[-1], scale))


def backward(
    do: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    causal: bool,
    scale: float | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dQ, dK, dV (shapes and dtypes of q, k, v), recomputing P from q, k and L."""
    return _kernels().backward(do, q, k, v, o, lse, causal, default_scale(q.shape[-1], scale))


def _fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float | None) -> tuple:
    return _kernels().output_like(q), q.new_empty(q.shape[:-1], dtype=torch.float32)


def _backward_fake(do, q, k, v, o, lse, causal, scale) -> tuple:
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _checks(impl: str) -> Callable[..., None]:
    """check(q, k, v, ...): each accepted as the registered impl accepts it, the three agreeing, Triton ready."""
    inputs = input_check(impl=impl, names=("q", "k", "v"), devices=DEVICES, dtypes=KERNEL_DTYPES, min_dim=QKV_RANK)

    def check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *options: object) -> None:
        inputs(q, k, v)
        check_qkv(q, k, v, impl=impl)
        _ready(q)

    return check


# fuselab::attention_triton (and _backward), from the factory every fused impl uses; defined at import (torch.compile
# must not trace their definition); the kernels themselves load on first call.
attention_triton = define_op(
    "attention_triton",
    forward,
    backward=backward,
    fake=_fake,
    backward_fake=_backward_fake,
    outputs=("o",),
    extras=("lse",),
    check=_checks("attention triton"),
    kind="python",
    defaults={"causal": False, "scale": None},
    replay=True,
)
ATTENTION.impl(
    "triton",
    devices=DEVICES,
    dtypes=KERNEL_DTYPES,
    min_dim=QKV_RANK,
    requires=triton_unavailable,
    backward=True,
    triton_kernels=lambda: _kernels().TRITON_KERNELS,
    doc="FlashAttention-2 in Triton: fused forward (online softmax, logsumexp), deterministic backward (dK/dV per key "
    "block, dQ per query block), causal block skipping, GQA, any d up to 256 in one or two power-of-two chunks, any "
    "strides.",
)(attention_triton)


def _flash_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The CS336 class's forward: the op while torch.compile traces (one opaque node), else the launcher itself."""
    if torch.compiler.is_compiling():
        return attention_triton.op(q, k, v, causal, scale)
    return _kernels().forward(q, k, v, causal, scale)


def _flash_backward(*args: object) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The CS336 class's backward (dO, q, k, v, O, L, causal, scale), as `_flash_forward` chooses."""
    if torch.compiler.is_compiling():
        return attention_triton.backward_op(*args)
    return _kernels().backward(*args)


FlashAttentionTriton = flash_function(
    "FlashAttentionTriton", _flash_forward, _flash_backward, check=_checks("FlashAttentionTriton")
)


def __getattr__(name: str) -> object:
    if name == "TRITON_KERNELS":
        return _kernels().TRITON_KERNELS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
