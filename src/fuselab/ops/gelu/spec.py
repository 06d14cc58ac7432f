"""GELU described once: float64 reference, inputs, cost model, tolerances.

GELU(x) = x * Phi(x), Phi the standard normal CDF. Two forms, as in F.gelu:
  exact ("none"):  0.5 * x * (1 + erf(x / sqrt(2)))
  tanh  ("tanh"):  0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))   (the lecture's; the default)
Special values follow F.gelu on the GPU: NaN -> NaN, +inf -> +inf, -inf -> NaN (the formula's -inf * 0).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from fuselab.bench.shapes import draw_size, draw_width
from fuselab.ops.registry import Defaults, Op, Option, Shape, randn, register_op

FORMS = ("tanh", "none")
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
KAPPA = 0.044715
SQRT1_2 = math.sqrt(0.5)


def check_form(approximate: str) -> None:
    """Raise ValueError unless `approximate` names a GELU form."""
    if approximate not in FORMS:
        raise ValueError(f"gelu: approximate={approximate!r} is not a GELU form; accepted: 'tanh', 'none' (erf)")


def reference(x: torch.Tensor, approximate: str = "tanh") -> torch.Tensor:
    """GELU in float64, written out (not F.gelu, which is an impl under test). x: any shape; same shape out."""
    check_form(approximate)
    x = x.double()
    if approximate == "tanh":
        return 0.5 * x * (1.0 + torch.tanh(SQRT_2_OVER_PI * (x + KAPPA * x * x * x)))
    return 0.5 * x * (1.0 + torch.erf(x * SQRT1_2))


def make_inputs(shape: Shape, dtype: torch.dtype, device: str, seed: int, **options: object) -> tuple[torch.Tensor]:
    """x ~ 3 * N(0, 1) of `shape`: covers both tails (GELU -> 0 and GELU -> x) and the curved middle."""
    return (randn(shape, dtype, device, seed, scale=3.0),)


def bytes_moved(shape: Shape, dtype: torch.dtype, backward: bool = False, **options: object) -> int:
    """Read x once, write y once: 2 * numel * itemsize bytes; with the backward also read x and dy, write dx: 5x."""
    return (5 if backward else 2) * math.prod(shape) * dtype.itemsize


RANDOM_NUMEL = (2**18, 2**28)  # the random draw's range: below it a call costs more on the host than on the GPU


def random_shape(rng: np.random.Generator) -> Shape:
    """A shape for the random-shape bench: numel log-uniform over RANDOM_NUMEL (with odd, prime and model sizes);
    half of them as (rows, width) with a width drawn from 1 .. 2^14 (for the non-contiguous layouts)."""
    n = draw_size(rng, *RANDOM_NUMEL)
    if rng.uniform() < 0.5:
        return (n,)
    width = draw_width(rng, 1, 2**14)
    return (max(1, n // width), width)


def flops(shape: Shape, **options: object) -> int:
    """9 per element, counted on the tanh form: x*x, *x, *0.044715, +x, *sqrt(2/pi), tanh (as 1), +1, *x, *0.5."""
    return 9 * math.prod(shape)


TANH = {"approximate": "tanh"}
ERF = {"approximate": "none"}
# What the report measures of GELU in each mode (see Op.report_plan): the tanh form at every size, erf at one.
REPORT = {
    "quick": {
        "check_shapes": [(1023,), (3, 37, 129)],
        "compile_check_shapes": [(1023,)],
        "bench_sweeps": [{"shapes": [(2**12,), (2**14,)], "options": TANH}, {"shapes": [(2**12,)], "options": ERF}],
    },
    "cpu": {
        "check_shapes": [(0,), (1,), (1023,), (4097,), (65537,), (3, 37, 129)],
        "check_dtypes": ["float32", "bfloat16"],
        "compile_check_shapes": [(4097,)],
        "bench_sweeps": [
            {"shapes": [(2**16,), (2**18,), (2**20,), (2**22,)], "options": TANH},
            {"shapes": [(2**20,)], "options": ERF},
        ],
        "bench_dtypes": ["float32", "bfloat16"],
    },
    "gpu": {
        "check_dtypes": ["float32", "float16", "bfloat16"],
        "compile_check_shapes": [(3, 37, 129)],  # one compile per case: few cases
        "compile_check_dtypes": ["float32", "bfloat16"],
        "bench_sweeps": [
            {"shapes": [(2**24,), (2**26,), (2**28,)], "options": TANH},
            {"shapes": [(2**26,)], "options": ERF},
        ],
        "bench_dtypes": ["float32", "bfloat16"],
    },
}

GELU = register_op(
    Op(
        name="gelu",
        reference=reference,
        make_inputs=make_inputs,
        bytes_moved=bytes_moved,
        flops=flops,
        # ||out - ref|| / ||ref||, measured on 3 * randn inputs. fp32: every impl ~3e-8 on the CPU (the GPU kernels'
        # ex2/rcp approximations add ~1e-7), so 1e-5 still catches a wrong constant or form (the forms differ by
        # 1e-4). fp16 / bf16: rounding the exact result to the dtype alone costs 1.1e-4 / 8.3e-4 (outputs) and
        # 1.9e-4 / 1.5e-3 (gradients); the naive impl, rounding every intermediate, reaches 6.4e-4 / 4.1e-3 on
        # its gradient. The tolerances are 3x the worst of these.
        tolerance={torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.2e-2},
        # no single-element shape: one value in a saturated tail makes ||out-ref||/||ref|| ill-conditioned
        defaults=Defaults(
            rows_from=1,  # elementwise: any slice is its own reference
            check_shapes=[(0,), (17,), (1023,), (4097,), (65537,), (3, 37, 129)],
            bench_shapes=[(2**24,), (2**26,), (2**28,)],
            profile_shape=(2**24,),
            large_shape=(2**31 + 3,),
            random_shape=random_shape,
            baseline="torch",
            report=REPORT,
        ),
        options=[Option("approximate", "tanh", FORMS, doc="'tanh' (the lecture's form) or 'none' (erf), as F.gelu")],
        title="GELU five ways",
        # under torch.compile, fuselab.nn.GELU() hands Inductor F.gelu at every size: Inductor fuses it into the
        # kernels around it as it does torch.nn.GELU (the matmul's epilogue under max-autotune). An opaque kernel
        # costs a launch of the host's more and splits the fusion, which decides a block's time wherever the host
        # is its bottleneck, whatever the size; where the GPU is, the Triton kernel's 4-13% less GPU time than
        # Inductor's GELU is about 1% of the block (docs/call-cost.md, the feed-forward block).
        traced_impl="torch",
        doc="GELU activation, y = x * Phi(x); option approximate='tanh' (default) or 'none' (erf), as F.gelu",
        package=__package__,
    )
)
