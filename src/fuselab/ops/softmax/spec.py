"""Softmax over the last dimension, described once: reference, inputs, cost model, tolerances, shapes."""

from __future__ import annotations

import math

import numpy as np
import torch

from fuselab.bench.shapes import draw_width, log_uniform
from fuselab.ops.registry import Defaults, Op, Shape, randn, register_op


def reference(x: torch.Tensor, **options: object) -> torch.Tensor:
    """torch.softmax in float64 over the last dimension; any shape, any device."""
    return torch.softmax(x.to(torch.float64), dim=-1)


def gradient_scale(x: torch.Tensor, dy: torch.Tensor, **options: object) -> tuple[float]:
    """||y * dy||: the terms dx = y * dy - y * sum(y * dy) cancels. On a nearly one-hot row ||dx|| is ~(1 - max y)
    of it, and rounding y to the dtype (which every backward from the saved output starts with) is magnified as
    much: at max y = 0.993, bf16 PyTorch's own gradient is 0.17 off ||dx||, 0.001 of ||y * dy||."""
    return (torch.linalg.vector_norm(reference(x) * dy).item(),)


def make_inputs(shape: Shape, dtype: torch.dtype, device: str, seed: int, **options: object) -> tuple[torch.Tensor]:
    """One tensor of `shape`, 4·N(0, 1): spread wide enough that the max subtraction matters, never all zeros."""
    return (randn(shape, dtype, device, seed, scale=4.0),)


def bytes_moved(shape: Shape, dtype: torch.dtype, backward: bool = False, **options: object) -> int:
    """Read x once, write y once; with the backward also read y and dy, write dx (5 passes)."""
    return (5 if backward else 2) * math.prod(shape) * dtype.itemsize


def flops(shape: Shape, **options: object) -> int:
    """Per element: compare (max), subtract, exp, add (sum), multiply (by 1/sum); each counted as one."""
    return 5 * math.prod(shape)


RANDOM_NUMEL = (2**18, 2**26)  # elements per drawn tensor (rows = numel / width, at least 1)


def random_shape(rng: np.random.Generator) -> Shape:
    """(rows, width) for the random-shape bench: width log-uniform over 1 .. 2^20 (odd, prime and model sizes among
    them), rows so that rows * width is log-uniform over RANDOM_NUMEL; one in ten rows of 4096 or more columns come
    as a small batch of 1 to 8 rows (3 x 11008)."""
    width = draw_width(rng)
    if width >= 4096 and rng.uniform() < 0.1:
        return (int(rng.integers(1, 9)), width)
    return (max(1, log_uniform(rng, *RANDOM_NUMEL) // width), width)


WIDTHS = [2**k for k in range(7, 19)]  # 128 ... 262144


def _widths(numel: int, widths: list[int]) -> list[Shape]:
    return [(numel // w, w) for w in widths]


REPORT = {
    "quick": {
        "check_shapes": [(37, 129), (4, 5, 300)],
        "compile_check_shapes": [(37, 129)],
        "bench_sweeps": [{"shapes": _widths(2**14, [128, 1024]), "options": {}}],
        "x": "width",
    },
    "cpu": {
        "check_shapes": [(0, 7), (5, 0), (), (1, 1), (1000,), (37, 129), (4, 5, 300), (2, 5000), (3, 40000)],
        "check_dtypes": ["float32", "bfloat16"],
        "compile_check_shapes": [(37, 129)],
        "bench_sweeps": [{"shapes": _widths(2**20, [128, 1024, 8192, 65536]), "options": {}}],
        "x": "width",
    },
    "gpu": {
        "check_dtypes": ["float32", "float16", "bfloat16"],
        "compile_check_shapes": [(3, 40000)],
        "compile_check_dtypes": ["float32", "bfloat16"],
        "bench_sweeps": [
            {"shapes": _widths(2**26, [128, 1024, 4096, 8192, 16384, 32768, 65536, 262144]), "options": {}}
        ],
        "bench_dtypes": ["float32", "bfloat16"],
        "x": "width",
    },
}

SOFTMAX = register_op(
    Op(
        name="softmax",
        title="Softmax all ways",
        doc="softmax over the last dimension: y = exp(x - max) / sum(exp(x - max)), math in fp32",
        # fp32: fast exp and a reciprocal cost a few ulp; fp16/bf16: the output's rounding (2^-11, 2^-8).
        tolerance={torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 8e-3},
        reference=reference,
        gradient_scale=gradient_scale,
        make_inputs=make_inputs,
        bytes_moved=bytes_moved,
        flops=flops,
        defaults=Defaults(
            rows_from=2,  # each row its own softmax (a 1-D input is one row)
            check_shapes=[
                (0, 7),  # no rows
                (5, 0),  # empty rows: torch.softmax returns an empty (5, 0) tensor
                (),  # a scalar is one row of one element: softmax is 1
                (1, 1),
                (3, 1),
                (1000,),
                (37, 129),
                (70000, 3),  # more rows than a 65535 grid dimension
                (4, 5, 300),
                (2, 5000),
                (3, 40000),  # wider than a row held whole by one program: the looped/split kernels
                (7, 20001),  # odd, few wide rows: the backward splits each row over programs
            ],
            bench_shapes=[(2**26 // w, w) for w in WIDTHS],
            profile_shape=(4096, 4096),
            large_shape=(2**21 + 3, 1024),  # 2^31 + 3072 elements: the last rows start past 2^31
            random_shape=random_shape,
            rivals=("liger",),
            report=REPORT,
        ),
        package=__package__,
    )
)
