"""A toy op defined outside fuselab's ops/ folder, as a contributor would write a new one: scaled add,
out = a + alpha * b, with two named inputs, a float option, a PyTorch impl, a naive one and a Triton kernel.
Registering it (`register()`) is all it takes for check, bench, profile, inspect and the report to show it."""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from fuselab.ops.backends import triton_unavailable
from fuselab.ops.registry import Defaults, Op, Option, get_op, register_op, unregister_op

NAME = "scaled_add"


@triton.jit
def scaled_add_kernel(a_ptr, b_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(a_ptr + offs, mask=mask).to(tl.float32)
    b = tl.load(b_ptr + offs, mask=mask).to(tl.float32)
    tl.store(out_ptr + offs, (a + alpha * b).to(out_ptr.dtype.element_ty), mask=mask)


def reference(a: torch.Tensor, b: torch.Tensor, alpha: float = 0.5) -> torch.Tensor:
    return a.double() + alpha * b.double()


def make_inputs(shape, dtype, device, seed, **options):
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(shape, generator=gen).to(device, dtype) + 0.25 for _ in range(2))


def torch_impl(a: torch.Tensor, b: torch.Tensor, alpha: float = 0.5) -> torch.Tensor:
    return torch.add(a, b, alpha=alpha)


def naive_impl(a: torch.Tensor, b: torch.Tensor, alpha: float = 0.5) -> torch.Tensor:
    return a + b * alpha


def triton_impl(a: torch.Tensor, b: torch.Tensor, alpha: float = 0.5) -> torch.Tensor:
    if a.shape != b.shape:
        raise ValueError(f"scaled_add triton: a {tuple(a.shape)} and b {tuple(b.shape)} must have one shape")
    a, b = a.contiguous(), b.contiguous()
    out = torch.empty_like(a)
    n = a.numel()
    block = 1024
    if n:
        scaled_add_kernel[(triton.cdiv(n, block),)](a, b, out, n, alpha, BLOCK=block)
    return out


def build() -> Op:
    op = Op(
        name=NAME,
        inputs=("a", "b"),
        reference=reference,
        make_inputs=make_inputs,
        bytes_moved=lambda shape, dtype, **o: 3 * math.prod(shape) * dtype.itemsize,
        flops=lambda shape, **o: 2 * math.prod(shape),
        tolerance={torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2},
        defaults=Defaults(
            check_shapes=[(1,), (1023,), (3, 17)],
            bench_shapes=[(4096,)],
            profile_shape=(4096,),
            report={"quick": {"check_shapes": [(1023,)], "bench_sweeps": [{"shapes": [(2048,)], "options": {}}]}},
        ),
        options=[Option("alpha", 0.5, doc="the scale of b")],
        title="Toy: scaled add",
    )
    op.impl("naive", backward=True)(naive_impl)
    op.impl("torch", backward=True)(torch_impl)
    op.impl("triton", requires=triton_unavailable, triton_kernels=lambda: [scaled_add_kernel])(triton_impl)
    return op


def register() -> Op:
    unregister_op(NAME)
    return register_op(build())


def unregister() -> None:
    unregister_op(NAME)


__all__ = ["NAME", "get_op", "register", "unregister"]
