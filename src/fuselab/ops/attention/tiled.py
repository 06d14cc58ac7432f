"""FlashAttention-2 in plain PyTorch (impl "tiled"): the algorithm written to be read, runnable on the CPU.

Forward (FA-2 Algorithm 1): for each tile of TILE_Q queries, stream over tiles of TILE_K keys keeping, per query row,
the running maximum m, the running sum l of exp(s - m) and the unnormalised output acc; when a new tile raises the
maximum, l and acc are rescaled by exp(m_old - m_new) (the online softmax). At the end O = acc / l and the logsumexp
L = m + log(l) (natural log) is kept: it is all the backward needs of the softmax.

Backward (FA-2 Algorithm 2): D = rowsum(dO * O); for each key tile (outer loop) and query tile (inner loop) the
probabilities are recomputed from q, k and L as P = exp(q k^T * scale - L), never stored; then
dV += P^T dO, dP = dO V^T, dS = P * (dP - D), dQ += dS K * scale, dK += dS^T Q * scale.

Causal: key tiles wholly above the diagonal are skipped (both passes); only tiles crossing it are masked.
GQA: q is viewed as (Z, Hkv, G, Nq, d) and k, v as (Z, Hkv, 1, Nk, d), so a key/value head serves its G query heads
by broadcasting; its gradients are summed over G. Math is in float32 (float64 for float64 inputs).
"""

from __future__ import annotations

import torch

from fuselab.ops.attention.spec import ATTENTION, FLOATS, QKV_RANK, check_qkv, flash_function
from fuselab.ops.backends import input_check

TILE_Q = 64
DEVICES = ("cpu", "cuda")
TILE_K = 64


def _grouped(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """q as (Z, Hkv, G, Nq, d), k and v as (Z, Hkv, 1, Nk, d), in the math dtype."""
    shapes = check_qkv(q, k, v, impl="attention tiled")
    math_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    hq, hkv = shapes.hq, shapes.hkv
    qg = q.reshape(-1, hkv, hq // hkv, shapes.nq, shapes.d).to(math_dtype)
    kg = k.reshape(-1, hkv, 1, shapes.nk, shapes.d).to(math_dtype)
    vg = v.reshape(-1, hkv, 1, shapes.nk, shapes.dv).to(math_dtype)
    return qg, kg, vg


def _diagonal_mask(i0: int, i1: int, j0: int, j1: int, device: torch.device) -> torch.Tensor | None:
    """True where key j > query i in the tile (to be masked), or None when no key of the tile is above the diagonal."""
    if j1 - 1 <= i0:
        return None
    i = torch.arange(i0, i1, device=device)[:, None]
    j = torch.arange(j0, j1, device=device)[None, :]
    return j > i


def tiled_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """O (q's shape and dtype) and L (q's shape without d, float32, natural log), tile by tile."""
    qg, kg, vg = _grouped(q, k, v)
    nq, nk = qg.shape[-2], kg.shape[-2]
    outs, lses = [], []  # per query tile, joined at the end: no in-place writes for torch.compile to track
    for i0 in range(0, nq, TILE_Q):
        i1 = min(i0 + TILE_Q, nq)
        qi = qg[..., i0:i1, :]
        m = torch.full(qi.shape[:-1], float("-inf"), dtype=qg.dtype, device=q.device)
        l = torch.zeros_like(m)  # noqa: E741  (the paper's name)
        acc = torch.zeros((*qi.shape[:-1], vg.shape[-1]), dtype=qg.dtype, device=q.device)
        end = min(nk, i1) if causal else nk  # causal: key tiles past the last query are skipped
        for j0 in range(0, end, TILE_K):
            j1 = min(j0 + TILE_K, nk)
            s = torch.matmul(qi, kg[..., j0:j1, :].transpose(-1, -2)) * scale
            mask = _diagonal_mask(i0, i1, j0, j1, q.device) if causal else None
            if mask is not None:
                s = s.masked_fill(mask, float("-inf"))
            m_new = torch.maximum(m, s.amax(dim=-1))
            p = torch.exp(s - m_new[..., None])
            alpha = torch.exp(m - m_new)  # rescales what was summed under the old maximum
            l = alpha * l + p.sum(dim=-1)  # noqa: E741
            acc = alpha[..., None] * acc + torch.matmul(p, vg[..., j0:j1, :])
            m = m_new
        outs.append(acc / l[..., None])
        lses.append(m + torch.log(l))
    out = torch.cat(outs, dim=-2) if outs else qg.new_empty((*qg.shape[:-1], vg.shape[-1]))
    lse = torch.cat(lses, dim=-1) if lses else qg.new_empty(qg.shape[:-1])
    o_shape = (*q.shape[:-1], v.shape[-1])
    # fresh tensors, not views of `out` and `lse`: torch 2.11's torch.compile gives an autograd.Function whose forward
    # returns views zero gradients (in fp32, where .to() would not copy)
    return out.reshape(o_shape).to(q.dtype, copy=True), lse.reshape(q.shape[:-1]).to(torch.float32, copy=True)


def tiled_backward(
    do: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    causal: bool,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dQ, dK, dV (shapes and dtypes of q, k, v) by recomputation from q, k, v, O and L (FA-2 Algorithm 2)."""
    qg, kg, vg = _grouped(q, k, v)
    nq, nk = qg.shape[-2], kg.shape[-2]
    dog = do.reshape((*qg.shape[:-1], vg.shape[-1])).to(qg.dtype)
    og = o.reshape(dog.shape).to(qg.dtype)
    lg = lse.reshape(qg.shape[:-1]).to(qg.dtype)
    delta = (dog * og).sum(dim=-1)  # D_i = rowsum(dO_i * O_i) = sum_j P_ij dP_ij
    starts = range(0, nq, TILE_Q)
    dqs = [torch.zeros_like(qg[..., i0 : i0 + TILE_Q, :]) for i0 in starts]  # per query tile, joined at the end
    dks, dvs = [], []
    for j0 in range(0, nk, TILE_K):
        j1 = min(j0 + TILE_K, nk)
        kj, vj = kg[..., j0:j1, :], vg[..., j0:j1, :]
        dkj, dvj = torch.zeros_like(kj), torch.zeros_like(vj)
        first = j0 // TILE_Q if causal else 0  # causal: query tiles before the key tile see none of it
        for t in range(first, len(starts)):
            i0 = starts[t]
            i1 = min(i0 + TILE_Q, nq)
            qi, doi = qg[..., i0:i1, :], dog[..., i0:i1, :]
            s = torch.matmul(qi, kj.transpose(-1, -2)) * scale
            mask = _diagonal_mask(i0, i1, j0, j1, q.device) if causal else None
            if mask is not None:
                s = s.masked_fill(mask, float("-inf"))
            p = torch.exp(s - lg[..., i0:i1, None])  # recomputed, exactly normalised by L
            dvj = dvj + torch.matmul(p.transpose(-1, -2), doi).sum(dim=2, keepdim=True)
            dp = torch.matmul(doi, vj.transpose(-1, -2))
            ds = p * (dp - delta[..., i0:i1, None])
            dqs[t] = dqs[t] + torch.matmul(ds, kj) * scale
            dkj = dkj + torch.matmul(ds.transpose(-1, -2), qi).sum(dim=2, keepdim=True) * scale
        dks.append(dkj)
        dvs.append(dvj)
    dq = torch.cat(dqs, dim=-2) if dqs else torch.zeros_like(qg)
    dk = torch.cat(dks, dim=-2) if dks else torch.zeros_like(kg)
    dv = torch.cat(dvs, dim=-2) if dvs else torch.zeros_like(vg)
    return dq.reshape(q.shape).to(q.dtype), dk.reshape(k.shape).to(k.dtype), dv.reshape(v.shape).to(v.dtype)


FlashAttentionTiled = flash_function(
    "FlashAttentionTiled",
    tiled_forward,
    tiled_backward,
    check=input_check(
        impl="FlashAttentionTiled", names=("q", "k", "v"), devices=DEVICES, dtypes=FLOATS, min_dim=QKV_RANK
    ),
)


@ATTENTION.impl("tiled", devices=DEVICES, dtypes=FLOATS, min_dim=QKV_RANK, backward=True)
def attention_tiled(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, scale: float | None = None
) -> torch.Tensor:
    """FlashAttention-2 in plain PyTorch: 64 x 64 tiles, online softmax, logsumexp, backward by recomputation."""
    check_qkv(q, k, v, impl="attention tiled")
    return FlashAttentionTiled.apply(q, k, v, causal, scale)
