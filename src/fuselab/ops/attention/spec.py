"""Scaled dot-product attention described once: float64 reference, inputs, cost model, tolerances, shapes.

    O = softmax(Q K^T * scale + mask) V,   scale = 1/sqrt(d) by default

q (..., Hq, Nq, d), k and v (..., Hkv, Nk, d) with Hq a multiple of Hkv (grouped-query / multi-query attention:
query head h reads key/value head h // (Hq // Hkv), as `repeat_interleave` of k and v over the head dim), or the
3-D layout (batch, N, d) with no head dim. `causal` masks key j for query i where j > i, aligned top-left as
`F.scaled_dot_product_attention(is_causal=True)`; with Nk >= 1 no row is ever fully masked (key 0 is always seen).

A case's shape descriptor (what `fuselab check|bench attention --shapes` parse):
    (B, N, d)                   3-D q, k, v
    (B, H, N, d)                4-D, Nq = Nk = N
    (B, H, Nq, Nk, d)           4-D, Nq != Nk
    (B, Hq, Hkv, Nq, Nk, d)     4-D, grouped-query attention
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from fuselab.ops.backends import FLOAT_DTYPES
from fuselab.ops.registry import Defaults, Op, Option, Shape, register_op

LOG2E = 1.4426950408889634
FLOATS = (*FLOAT_DTYPES, torch.float64)  # what the impls accept: the op's dtypes, and float64
QKV_RANK = 3  # the fewest dims of q, k, v: (batch, N, d)


@dataclass(frozen=True)
class AttentionShapes:
    """The dimensions of one call, read from checked q, k, v (see :func:`check_qkv`)."""

    batch: tuple[int, ...]  # leading dims before the head dim (3-D: (B,))
    hq: int  # query heads (1 for 3-D)
    hkv: int  # key/value heads
    nq: int  # queries
    nk: int  # keys
    d: int  # head dim of q and k
    dv: int  # head dim of v
    three_d: bool  # (batch, N, d) inputs with no head dim

    @property
    def group(self) -> int:
        """Query heads per key/value head."""
        return self.hq // self.hkv


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, impl: str) -> AttentionShapes:
    """Raise a clear TypeError/ValueError unless q, k, v agree as attention inputs; return their dimensions.

    Each is a tensor its impl accepts (device, dtype, at least 3 dims: checked where the impl is registered, or by
    `input_check`); here: one dtype and one device, all 3-D (batch, N, d) or all with the same leading dims
    (..., H, N, d), k and v of equal shape, q's d equal to k's, Hq a multiple of Hkv, Nk >= 1.
    """
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"{impl}: q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"{impl}: q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if q.dim() < 3 or k.dim() != q.dim() or v.dim() != q.dim():
        raise ValueError(
            f"{impl}: q, k, v must all be 3-D (batch, N, d) or 4-D+ (..., heads, N, d) of one rank,"
            f" got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if k.shape != v.shape:
        raise ValueError(f"{impl}: k {tuple(k.shape)} and v {tuple(v.shape)} must have the same shape")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"{impl}: q's head dim {q.shape[-1]} differs from k's {k.shape[-1]}; they must be equal")
    if q.shape[-1] < 1:
        raise ValueError(f"{impl}: the head dim must be >= 1, got {q.shape[-1]}")
    if k.shape[-2] < 1:
        raise ValueError(f"{impl}: k and v need at least one key (Nk >= 1), got shape {tuple(k.shape)}")
    three_d = q.dim() == 3
    if three_d:
        if q.shape[0] != k.shape[0]:
            raise ValueError(f"{impl}: batch dims differ: q {tuple(q.shape)}, k {tuple(k.shape)}")
        return AttentionShapes((q.shape[0],), 1, 1, q.shape[1], k.shape[1], q.shape[2], v.shape[2], True)
    if q.shape[:-3] != k.shape[:-3]:
        raise ValueError(f"{impl}: batch dims differ: q {tuple(q.shape)}, k {tuple(k.shape)}")
    hq, hkv = q.shape[-3], k.shape[-3]
    if hkv < 1 or hq % hkv:
        raise ValueError(
            f"{impl}: q's {hq} heads must be a multiple of k/v's {hkv} heads (grouped-query attention), got"
            f" q {tuple(q.shape)}, k {tuple(k.shape)}"
        )
    return AttentionShapes(tuple(q.shape[:-3]), hq, hkv, q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1], False)


def default_scale(d: int, scale: float | None) -> float:
    """scale, or 1/sqrt(d) when None."""
    return 1.0 / math.sqrt(d) if scale is None else float(scale)


def repeat_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """k and v with their heads repeated to q's count (repeat_interleave over dim -3); unchanged when 3-D or equal."""
    if q.dim() == 3 or q.shape[-3] == k.shape[-3]:
        return k, v
    group = q.shape[-3] // k.shape[-3]
    return k.repeat_interleave(group, dim=-3), v.repeat_interleave(group, dim=-3)


def reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, scale: float | None = None
) -> torch.Tensor:
    """Attention in float64, written out: softmax(q k^T * scale, top-left causal mask) v. Shapes as the module doc.

    The scores are made REFERENCE_SCORES queries' worth at a time (each query's row is its own softmax), so the
    reference needs about its inputs and output in float64 beside 256 MiB of scores, not all N x N of them at once
    (34 GB at (1, 32, 16384, 64))."""
    check_qkv(q, k, v, impl="attention reference")
    q, k, v = q.double(), k.double(), v.double()
    k, v = repeat_kv(q, k, v)
    scale = default_scale(q.shape[-1], scale)
    nq, nk = q.shape[-2], k.shape[-2]
    block = max(1, REFERENCE_SCORES // max(1, math.prod(q.shape[:-2]) * nk))
    if block >= nq:
        return _attend(q, k, v, 0, causal, scale)
    out = q.new_empty((*q.shape[:-1], v.shape[-1]))
    for start in range(0, nq, block):
        out[..., start : start + block, :] = _attend(q[..., start : start + block, :], k, v, start, causal, scale)
    return out


REFERENCE_SCORES = 2**25  # float64 scores the reference holds at a time: 256 MiB


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, first: int, causal: bool, scale: float) -> torch.Tensor:
    """softmax(q k^T * scale) v for queries first, first + 1, ... (the top-left causal mask keeps key j <= query i)."""
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    if causal:
        rows = torch.arange(first, first + q.shape[-2], device=q.device)
        keep = rows[:, None] >= torch.arange(k.shape[-2], device=q.device)[None, :]
        s = s.masked_fill(~keep, float("-inf"))
    return torch.matmul(torch.softmax(s, dim=-1), v)


def dims(shape: Shape) -> tuple[int, int, int, int, int, int, bool]:
    """(B, Hq, Hkv, Nq, Nk, d, three_d) of a case's shape descriptor (see the module doc)."""
    if len(shape) == 3:
        b, n, d = shape
        return b, 1, 1, n, n, d, True
    if len(shape) == 4:
        b, h, n, d = shape
        return b, h, h, n, n, d, False
    if len(shape) == 5:
        b, h, nq, nk, d = shape
        return b, h, h, nq, nk, d, False
    if len(shape) == 6:
        b, hq, hkv, nq, nk, d = shape
        return b, hq, hkv, nq, nk, d, False
    raise ValueError(
        f"attention shape {shape}: expected (B, N, d), (B, H, N, d), (B, H, Nq, Nk, d) or (B, Hq, Hkv, Nq, Nk, d)"
    )


def make_inputs(
    shape: Shape, dtype: torch.dtype, device: str, seed: int, **options: object
) -> tuple[torch.Tensor, ...]:
    """q, k, v ~ N(0, 1) (scores then have unit spread at scale 1/sqrt(d)), never zeros, seeded."""
    b, hq, hkv, nq, nk, d, three_d = dims(shape)
    gen = torch.Generator(device=device).manual_seed(seed)

    def draw(*size: int) -> torch.Tensor:
        return torch.randn(size, generator=gen, device=device, dtype=torch.float32).to(dtype)

    if three_d:
        return draw(b, nq, d), draw(b, nk, d), draw(b, nk, d)
    return draw(b, hq, nq, d), draw(b, hkv, nk, d), draw(b, hkv, nk, d)


def bytes_moved(shape: Shape, dtype: torch.dtype, **options: object) -> int:
    """q, k, v read once and o written once (what a fused forward must move)."""
    b, hq, hkv, nq, nk, d, _ = dims(shape)
    return (2 * b * hq * nq * d + 2 * b * hkv * nk * d) * dtype.itemsize


def flops(shape: Shape, causal: bool = False, backward: bool = False, **options: object) -> int:
    """The FlashAttention papers' convention: forward 4*B*H*Nq*Nk*d (two matmuls), halved when causal;
    backward 2.5x the forward (five matmuls, recomputation not counted); backward=True gives forward + backward."""
    b, hq, _, nq, nk, d, _ = dims(shape)
    fwd = 4 * b * hq * nq * nk * d
    if causal:
        fwd //= 2
    return int(fwd * 3.5) if backward else fwd


# The papers' grid: 16k tokens, hidden 2048 (heads = 2048 / d), N from 512 to 16384.
PAPER_GRID = [(16384 // n, 2048 // d, n, d) for d in (64, 128) for n in (512, 1024, 2048, 4096, 8192, 16384)]
LEADERBOARD = (16, 16384, 64)  # CS336's leaderboard step: q, k, v (16, 16384, 64), causal, forward + backward
HEAD_DIMS = (32, 48, 64, 80, 96, 128, 192, 256)


def random_shape(rng: object) -> Shape:
    """(B, Hq, Hkv, Nq, Nk, d): N log-uniform over 1..16384 (Nk = Nq half the time), a head dim of today's models,
    grouped-query heads a third of the time, about 2^20..2^24 query elements in all."""
    import numpy as np

    rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    nq = max(1, round(2 ** rng.uniform(0, 14)))
    nk = nq if rng.random() < 0.5 else max(1, round(2 ** rng.uniform(0, 14)))
    d = int(rng.choice(HEAD_DIMS))
    hkv = int(rng.choice([1, 2, 4, 8]))
    hq = hkv * (int(rng.choice([2, 4, 8])) if rng.random() < 1 / 3 else 1)
    b = max(1, int(2 ** rng.uniform(20, 24)) // (hq * nq * d))
    return (b, hq, hkv, nq, nk, d)


REPORT = {
    "quick": {
        "check_shapes": [(1, 2, 17, 16)],
        "compile_check_shapes": [(2, 1, 16)],
        "bench_sweeps": [{"shapes": [(1, 2, 64, 32)], "options": {"causal": False}}],
        "x": "axis",
    },
    "cpu": {
        "check_shapes": [(2, 1, 16), (1, 2, 17, 48), (2, 3, 65, 33, 80), (1, 4, 2, 130, 70, 64)],
        "bench_sweeps": [{"shapes": [(1, 4, n, 64) for n in (128, 256, 512)], "options": {"causal": False}}],
        "x": "axis",
    },
    "gpu": {
        "check_dtypes": ["float32", "float16", "bfloat16"],
        "compile_check_shapes": [(1, 2, 17, 48)],
        "bench_dtypes": ["bfloat16"],
        "passes": ("forward", "forward+backward"),
        "bench_sweeps": [
            {"shapes": [s for s in PAPER_GRID if s[-1] == 64], "options": {"causal": True}},
            {"shapes": [LEADERBOARD], "options": {"causal": True}},
        ],
        "x": "axis",
    },
}

ATTENTION = register_op(
    Op(
        name="attention",
        reference=reference,
        make_inputs=make_inputs,
        bytes_moved=bytes_moved,
        flops=flops,
        # ||out - ref|| / ||ref|| on N(0, 1) inputs. fp32: the kernels compute in fp32 (no TF32), errors ~1e-6.
        # fp16 / bf16: rounding the output alone costs ~3e-4 / ~2.5e-3; P rounded to the dtype before P @ V and
        # the gradients' longer chains add a few times that.
        tolerance={torch.float32: 2e-5, torch.float16: 3e-3, torch.bfloat16: 2.4e-2},
        defaults=Defaults(
            check_shapes=[(2, 1, 16), (1, 2, 17, 48), (2, 3, 65, 33, 80), (1, 4, 2, 130, 70, 64), (2, 2, 1, 1, 9, 16)],
            bench_shapes=[(16, 16384, 64), *PAPER_GRID],
            profile_shape=(1, 16, 4096, 64),
            random_shape=random_shape,
            axis=("N", lambda shape: dims(shape)[3]),
            panel=lambda shape: f"d={shape[-1]}" if shape else "",
            baseline="sdpa",
            peers=("sdpa", "sdpa-flash", "sdpa-cudnn"),
            report=REPORT,
        ),
        options=[Option("causal", False, (False, True), doc="mask key j for query i where j > i (top-left)")],
        inputs=("q", "k", "v"),
        bound="compute",
        title="Attention: FlashAttention-2 in Triton against SDPA",
        doc="scaled dot-product attention softmax(q k^T / sqrt(d)) v; option causal (top-left), GQA, 3-D or 4-D",
        package=__package__,
    )
)


Forward = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, bool, float], tuple[torch.Tensor, torch.Tensor]]
Backward = Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def flash_function(
    name: str, forward: Forward, backward: Backward, check: Callable[..., object] | None = None
) -> type[torch.autograd.Function]:
    """CS336's autograd interface on a forward (q, k, v, causal, scale) -> (O, L) and a backward
    (dO, q, k, v, O, L, causal, scale) -> (dQ, dK, dV): `Cls.apply(q, k, v, is_causal=False, scale=None)`.

    q (B, Nq, d) or (..., Hq, Nq, d); k, v (B, Nk, d) or (..., Hkv, Nk, d). Saves exactly q, k, v, O and L, the
    logsumexp of shape (B, Nq) (or (..., Hq, Nq)), float32, natural log. check(q, k, v) runs first, if given.
    """

    class FlashAttention(torch.autograd.Function):
        @staticmethod
        def forward(
            ctx: torch.autograd.function.FunctionCtx,
            q: torch.Tensor,
            k: torch.Tensor,
            v: torch.Tensor,
            is_causal: bool = False,
            scale: float | None = None,
        ) -> torch.Tensor:
            if check is not None:
                check(q, k, v)
            scale = default_scale(q.shape[-1], scale)
            o, lse = forward(q, k, v, bool(is_causal), scale)
            ctx.save_for_backward(q, k, v, o, lse)
            ctx.is_causal, ctx.scale = bool(is_causal), scale
            return o

        @staticmethod
        def backward(ctx: torch.autograd.function.FunctionCtx, do: torch.Tensor) -> tuple:
            q, k, v, o, lse = ctx.saved_tensors
            return (*backward(do, q, k, v, o, lse, ctx.is_causal, ctx.scale), None, None)

    FlashAttention.__name__ = FlashAttention.__qualname__ = name
    FlashAttention.__doc__ = f"{name}.apply(q, k, v, is_causal=False, scale=None): " + (flash_function.__doc__ or "")
    return FlashAttention


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    scale: float | None = None,
    impl: str = "triton",
) -> torch.Tensor:
    """softmax(q k^T * scale, causal mask) v by the registered implementation `impl`.

    q (..., Hq, Nq, d) or (B, Nq, d); k, v (..., Hkv, Nk, d) or (B, Nk, d); returns q's shape with v's d, q's dtype.
    An unknown impl raises ValueError listing the known ones.
    """
    from fuselab.ops.registry import UnknownName

    try:
        found = ATTENTION.get_impl(impl)
    except UnknownName as e:
        raise ValueError(str(e)) from None
    return found.fn(q, k, v, causal=causal, scale=scale)
