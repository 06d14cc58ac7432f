"""Random shapes for the shape-robustness bench (`fuselab bench OP --shapes random:N --seed S`); knows no op.

An op supplies `random_shape(rng) -> Shape` in its spec, built from the draws here: element counts log-uniform over
the op's range, widths log-uniform from 1 to 2^20, with a share of odd sizes, of primes, and of the sizes models
use (vocabularies of 50 257 or 151 936, hidden sizes of 11 008, ...). The bench times every impl on each drawn shape
and `summarize` reports, per impl and dtype, the time ratio against the best of the peers (the PyTorch built-in and
torch.compile): worst, 95th percentile, geometric mean and the five worst shapes. `apply_layout` turns an input into
a non-contiguous tensor holding the same values (transposed, sliced, expanded).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from fuselab.bench.record import Row

Shape = tuple[int, ...]

# Last dimensions models use: vocabularies (GPT-2, Llama 2/3, Qwen 2, Gemma, Mistral), hidden and MLP sizes
# (Llama 2 7B 4096/11008, 3 x 11008 = 33024 for a fused gate/up/down, Llama 3 8B 14336, 70B 28672, Qwen 18944, ...),
# attention widths (sequence lengths that are not powers of two).
COMMON_SIZES = (50257, 151936, 11008, 33024, 32000, 128256, 152064, 256000, 32768 + 1, 4096, 5120, 14336, 28672,
                18944, 3072, 768, 1000, 1025, 129, 197, 577)  # fmt: skip

LAYOUTS = ("contiguous", "transposed", "sliced", "expanded")


def format_shape(shape: Sequence[int]) -> str:
    """(3, 11008) -> "3x11008"; () -> "scalar": the one way a shape is written in tables, names and logs."""
    return "x".join(str(d) for d in shape) if len(shape) else "scalar"


ODD_SHARE = 0.25
PRIME_SHARE = 0.15
COMMON_SHARE = 0.15


def is_prime(n: int) -> bool:
    """Whether n is prime (trial division; n up to a few billion)."""
    if n < 2:
        return False
    if n % 2 == 0:
        return n == 2
    return all(n % d for d in range(3, math.isqrt(n) + 1, 2))


def next_prime(n: int) -> int:
    """The smallest prime >= n."""
    n = max(n, 2)
    while not is_prime(n):
        n += 1
    return n


def log_uniform(rng: np.random.Generator, lo: int, hi: int) -> int:
    """An integer in [lo, hi], its logarithm uniform."""
    if not 1 <= lo <= hi:
        raise ValueError(f"log_uniform needs 1 <= lo <= hi, got lo={lo}, hi={hi}")
    return min(hi, max(lo, round(math.exp(rng.uniform(math.log(lo), math.log(hi + 0.5))))))


def draw_size(
    rng: np.random.Generator,
    lo: int,
    hi: int,
    *,
    common: Sequence[int] = COMMON_SIZES,
    odd_share: float = ODD_SHARE,
    prime_share: float = PRIME_SHARE,
    common_share: float = COMMON_SHARE,
) -> int:
    """A size in [lo, hi]: log-uniform, then made prime (share `prime_share`), odd (`odd_share`), or replaced by one
    of the `common` sizes within range (`common_share`); the rest are left as drawn (even numbers mostly)."""
    n = log_uniform(rng, lo, hi)
    u = rng.uniform()
    if u < prime_share:
        p = next_prime(n)
        return p if p <= hi else n
    if u < prime_share + odd_share:
        return n | 1 if (n | 1) <= hi else n
    if u < prime_share + odd_share + common_share:
        fitting = [c for c in common if lo <= c <= hi]
        return int(fitting[rng.integers(len(fitting))]) if fitting else n
    return n


def draw_width(rng: np.random.Generator, lo: int = 1, hi: int = 2**20) -> int:
    """A last dimension, log-uniform in [lo, hi] (default 1 .. 2^20) with the odd, prime and common shares."""
    return draw_size(rng, lo, hi)


def parse_random(spec: str) -> int | None:
    """'random:N' -> N; None for any other text."""
    if not spec.startswith("random:"):
        return None
    try:
        n = int(spec.removeprefix("random:"))
    except ValueError:
        raise ValueError(f"--shapes takes random:N with N a positive integer, got {spec!r}") from None
    if n < 1:
        raise ValueError(f"--shapes random:N needs N >= 1, got {n}")
    return n


def draw_shapes(
    random_shape: Callable[[np.random.Generator], Shape],
    n: int,
    seed: int,
    *,
    load: Callable[[Shape], float] | None = None,
    spread: float = 64.0,
) -> list[Shape]:
    """n distinct shapes from `random_shape`, reproducibly from `seed` (fewer when 100 n draws do not give n).

    load: the share of a cap a shape takes (1.0: at the cap), growing with its first dimension; a draw above the cap
    has its first dimension cut so its load lands log-uniform in [1 / spread, 1] (the rest of the draw, a row width
    or a head dimension, is kept); a draw still above the cap at a first dimension of 1 is dropped. Without `load`,
    the draws are taken as they come.
    """
    rng = np.random.default_rng(seed)
    shapes: dict[Shape, None] = {}
    for _ in range(100 * n):
        if len(shapes) == n:
            break
        shape = tuple(int(d) for d in random_shape(rng))
        if load is not None and shape and load(shape) > 1.0:
            shape = _cut_first(shape, load, math.exp(-rng.uniform(0.0, math.log(spread))))
            if shape is None:
                continue
        shapes[shape] = None
    return list(shapes)


def _cut_first(shape: Shape, load: Callable[[Shape], float], target: float) -> Shape | None:
    """`shape` with the largest first dimension whose load is at most `target`; None when even 1 is over 1.0."""
    if load((1, *shape[1:])) > 1.0:
        return None
    lo, hi = 1, shape[0]  # load((lo, ...)) <= target or lo == 1; find the largest such lo
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if load((mid, *shape[1:])) <= target:
            lo = mid
        else:
            hi = mid - 1
    return (lo, *shape[1:])


def scale_shape(shape: Shape, target: float, size: Callable[[Shape], float]) -> Shape:
    """`shape` resized so that size(shape) is as large as it can be without passing `target`: halving its largest
    leading dimension (a batch, rows, heads, a sequence) while too big, the last one (a row, a head dimension) only
    once every other is 1; then doubling the first while it fits. Gives the all-ones shape when nothing fits."""
    dims = [int(d) for d in shape]
    while dims and size(tuple(dims)) > target:
        lead = [i for i in range(len(dims) - 1) if dims[i] > 1]
        i = max(lead, key=lambda j: dims[j]) if lead else len(dims) - 1
        if dims[i] <= 1:
            break
        dims[i] //= 2
    while dims and size((2 * dims[0], *dims[1:])) <= target:
        dims[0] *= 2
    return tuple(dims)


def size_ladder(base: Shape, size: Callable[[Shape], float], lo: float, hi: float, factor: float = 4.0) -> list[Shape]:
    """Shapes grown or shrunk from `base` (`scale_shape`) to sizes lo, lo * factor, ... up to hi: distinct, ordered
    by size, each within [lo / factor, hi]."""
    if not 0 < lo <= hi or factor <= 1:
        raise ValueError(f"size_ladder needs 0 < lo <= hi and factor > 1, got lo={lo}, hi={hi}, factor={factor}")
    shapes: dict[Shape, None] = {}
    target = lo
    while target <= hi * (1 + 1e-9):
        shape = scale_shape(base, target, size)
        if lo / factor <= size(shape) <= hi:
            shapes[shape] = None
        target *= factor
    return sorted(shapes, key=size)


def apply_layout(t: torch.Tensor, layout: str) -> torch.Tensor:
    """A tensor of t's shape and values in `layout`:

    contiguous: t. transposed: last dimension not unit-stride (for 1-D: every other element of a buffer twice as
    long). sliced: rows with a padded, odd row stride (for 1-D: starting one element into a buffer, misaligned).
    expanded: t's first row broadcast along the first dimension (stride 0; the values change to that row's);
    1-D tensors are left as they are.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; accepted: {', '.join(LAYOUTS)}")
    if layout == "contiguous" or t.dim() == 0:
        return t
    if layout == "transposed":
        if t.dim() == 1:
            buf = torch.empty(2 * t.numel(), dtype=t.dtype, device=t.device)
            out = buf[::2]
        else:
            out = torch.empty(t.transpose(-1, -2).shape, dtype=t.dtype, device=t.device).transpose(-1, -2)
        out.copy_(t)
        return out
    if layout == "sliced":
        if t.dim() == 1:
            buf = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
            out = buf[1:]
        else:
            width = t.shape[-1]
            pad = 3 if width % 2 == 0 else 2  # an odd padded row stride: rows start at every alignment
            out = torch.empty((*t.shape[:-1], width + pad), dtype=t.dtype, device=t.device)[..., :width]
        out.copy_(t)
        return out
    if t.dim() == 1:
        return t
    return t[:1].expand(t.shape)


# ---------------------------------------------------------------------------------------------- summary


def add_ratios(rows: Sequence[Row], peers: Sequence[str]) -> list[Row]:
    """The rows with `best_peer` and `ratio` = their median / the fastest peer's median on the same case (None when
    no peer was timed there)."""
    best: dict[str, tuple[float, str]] = {}
    for r in rows:
        if r.case.impl in peers and r.measured and r.median_ms:
            key = r.case.peer_key
            if key not in best or r.median_ms < best[key][0]:
                best[key] = (r.median_ms, r.case.impl)
    out = []
    for r in rows:
        peer = best.get(r.case.peer_key)
        ok = peer is not None and r.measured and bool(r.median_ms)
        out.append(r.updated(best_peer=peer[1] if ok else None, ratio=r.median_ms / peer[0] if ok else None))
    return out


def summarize(rows: Sequence[Row], group_fields: Sequence[str] = ("impl", "dtype"), worst: int = 5) -> list[dict]:
    """Per group (impl, dtype): shapes timed, worst ratio, 95th percentile, geometric mean, and the `worst` worst
    shapes with their ratios. Rows need `ratio` (`add_ratios`); rows without one are left out."""
    groups: dict[tuple, list[Row]] = {}
    for r in rows:
        if r.ratio is not None:
            groups.setdefault(tuple(r.field(k) for k in group_fields), []).append(r)
    out = []
    for key, members in groups.items():
        ratios = np.array([m.ratio for m in members], dtype=np.float64)
        ranked = sorted(members, key=lambda m: m.ratio or 0.0, reverse=True)[:worst]
        out.append(
            {
                **dict(zip(group_fields, key, strict=True)),
                "shapes": len(members),
                "worst": float(ratios.max()),
                "p95": float(np.percentile(ratios, 95)),
                "geomean": float(np.exp(np.log(ratios).mean())),
                "worst_shapes": [{"shape": list(m.case.shape), "ratio": m.ratio} for m in ranked],
            }
        )
    return out


def x_axis(rows: Sequence[Row]) -> tuple[str, str]:
    """(field, label) to plot ratios against: the width (last dimension) when some shape has two or more
    dimensions, else the element count."""
    if any(len(r.case.shape) >= 2 for r in rows):
        return "width", "width (last dimension)"
    return "numel", "elements"


def _x(row: Row, field: str, axis: tuple[str, Callable[[Shape], float]] | None) -> float:
    shape = row.case.shape
    if axis is not None:
        return axis[1](shape)
    return (shape or (1,))[-1] if field == "width" else math.prod(shape)


def plot_ratios(
    rows: Sequence[Row], path: str | Path, title: str = "", axis: tuple[str, Callable[[Shape], float]] | None = None
) -> Path:
    """Ratio to the best peer against width or size, one point per shape, one panel per dtype, one colour per impl;
    a line at 1 (as fast as the best peer); both axes logarithmic, so a rival hundreds of times slower leaves the
    ratios near 1 readable. axis: (label, shape -> x) to plot against instead (an op's own axis)."""
    from matplotlib.ticker import FuncFormatter

    from fuselab.bench.results import pyplot, save_figure

    plt = pyplot()
    field, label = ("axis", axis[0]) if axis else x_axis(rows)
    rows = [r for r in rows if r.ratio is not None]
    dtypes = sorted({r.case.dtype for r in rows}) or [""]
    fig, axes = plt.subplots(1, len(dtypes), figsize=(6 * len(dtypes), 4.2), squeeze=False)
    for ax, dtype in zip(axes[0], dtypes, strict=True):
        mine = [r for r in rows if r.case.dtype == dtype]
        for impl in sorted({r.case.impl for r in mine}):
            pts = [r for r in mine if r.case.impl == impl]
            xs = [_x(r, field, axis) for r in pts]
            ax.scatter(xs, [r.ratio for r in pts], s=12, label=impl)
        ax.axhline(1.0, color="black", linestyle="--", linewidth=1)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_xlabel(label)
        ax.set_ylabel("time / best peer")
        ax.set_title(f"{title} {dtype}".strip())
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    return save_figure(fig, path)
