"""`scaled_dot_product_attention`, a drop-in for F.scaled_dot_product_attention on fuselab's kernels
(the integrator exposes it as fuselab.nn.functional.scaled_dot_product_attention)."""

from __future__ import annotations

import torch

from fuselab.ops.attention.spec import attention


def scaled_dot_product_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    is_causal: bool = False,
    scale: float | None = None,
    *,
    impl: str = "triton",
) -> torch.Tensor:
    """softmax(q k^T * scale, top-left causal mask if is_causal) v, computed by the registered impl `impl`.

    q (..., Hq, Nq, d) or (B, Nq, d); k, v (..., Hkv, Nk, d) or (B, Nk, d), Hq a multiple of Hkv; scale defaults to
    1/sqrt(d). No attn_mask or dropout. With impl="triton" it is the custom op fuselab::attention_triton (with
    autograd), which torch.compile(fullgraph=True) traces without a graph break.
    """
    return attention(q, k, v, causal=is_causal, scale=scale, impl=impl)


__all__ = ["scaled_dot_product_attention"]  # what fuselab.nn.functional exposes of this op
