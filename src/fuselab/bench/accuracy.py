"""How far an output is from its reference: relative errors of outputs and gradients (float64 norms), and
NaN-poisoning of the allocator so that unwritten outputs show. Generic over ops."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

POISON_BYTES = 8 * 2**30  # at most this much memory is poisoned before a check


def relative_error(out: torch.Tensor, ref: torch.Tensor, piece_rows: int | None = None) -> float:
    """||out - ref|| / ||ref|| over finite reference entries (float64).

    Non-finite reference entries must be matched exactly (same NaN, same signed inf), else the error is inf.
    A shape mismatch is inf. An all-zero reference gives the absolute error. piece_rows: add it up this many rows
    (along the first dimension) at a time, so no float64 copy of the whole is made.
    """
    if out.shape != ref.shape:
        return float("inf")
    if piece_rows is None or out.dim() == 0 or out.shape[0] == 0:
        return error_from_sums([error_sums(out, ref)])
    sums = [error_sums(out[i : i + piece_rows], ref[i : i + piece_rows]) for i in range(0, out.shape[0], piece_rows)]
    return error_from_sums(sums)


def error_sums(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """(||out - ref||^2, ||ref||^2) over the finite entries of ref, in float64; (inf, 0) where a non-finite entry
    differs, or out is not finite where ref is, or the shapes differ."""
    if out.shape != ref.shape:
        return math.inf, 0.0
    o = out.detach().to(torch.float64)
    r = ref.detach().to(device=o.device, dtype=torch.float64)
    finite = torch.isfinite(r)
    if not bool(finite.all()):
        bad = ~finite
        same_nan = torch.isnan(r[bad]) & torch.isnan(o[bad])
        same_inf = r[bad] == o[bad]
        if not bool((same_nan | same_inf).all()):
            return math.inf, 0.0
        o, r = o[finite], r[finite]
    if not bool(torch.isfinite(o).all()):
        return math.inf, 0.0
    return torch.linalg.vector_norm(o - r).item() ** 2, torch.linalg.vector_norm(r).item() ** 2


def error_from_sums(sums: Sequence[tuple[float, float]]) -> float:
    """The relative error from the (diff^2, ref^2) sums of its pieces."""
    if any(math.isinf(d) for d, _ in sums):
        return float("inf")
    diff, norm = math.sqrt(sum(d for d, _ in sums)), math.sqrt(sum(n for _, n in sums))
    return diff / norm if norm > 0 else diff


def gradient_error(
    grads: Sequence[torch.Tensor], refs: Sequence[torch.Tensor], scales: Sequence[float] | None = None
) -> float:
    """The worst input's gradient error: ||g - ref|| / ||ref|| per input, where an input's reference gradient is
    smaller than its share of the whole gradient (||all refs|| * sqrt(its numel / all numel)) measured against that
    share instead. Some gradients are zero by the math (attention's dQ and dK when each query sees one key): their
    own norm is rounding, and dividing by it turns 1e-7 of noise into a relative error of 1e24.
    scales: per input, a larger norm to measure against where the op's gradient cancels bigger terms
    (`Op.gradient_scale`)."""
    norms = [torch.linalg.vector_norm(r.detach().to(torch.float64)).item() for r in refs]
    total = sum(n * n for n in norms) ** 0.5
    numel = sum(r.numel() for r in refs) or 1
    worst = 0.0
    for i, (g, r, norm) in enumerate(zip(grads, refs, norms, strict=True)):
        floor = max(total * (r.numel() / numel) ** 0.5, scales[i] if scales else 0.0)
        err = relative_error(g, r)  # ||g - ref|| / ||ref|| (the absolute error where ||ref|| is 0)
        if norm < floor and math.isfinite(err):
            err *= (norm or 1.0) / floor
        worst = max(worst, err)
    return worst


def poison_allocator(nbytes: int, device: str | torch.device, blocks: int = 16) -> None:
    """Fill memory that the next allocations will likely reuse with NaN, so unwritten outputs show as NaN.

    Several blocks of the output's size are poisoned, since the allocator may hand out any recently freed block
    of that size (the CUDA caching allocator reuses deterministically; CPU malloc less so: best effort).
    """
    if nbytes > 0:
        blocks = max(1, min(blocks, POISON_BYTES // nbytes))  # outputs of GiBs: fewer blocks, not 16 x the output
        poisoned = [torch.full((max(nbytes // 4, 1),), float("nan"), device=device) for _ in range(blocks)]
        del poisoned
