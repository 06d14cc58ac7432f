"""`scaled_dot_product_attention`, a drop-in for F.scaled_dot_product_attention on fuselab's kernels
(the integrator exposes it as fuselab.nn.functional.scaled_dot_product_attention)."""

from __future__ import annotations

import torch

from fuselab.ops.attention.spec import ATTENTION, attention

# What impl="auto" runs per device type (Op.native_impl, as the nn modules resolve it), read at import: while
# torch.compile traces a call, the impls' availability checks could not run.
AUTO = {device: ATTENTION.native_impl(device) for device in ("cpu", "cuda")}


def scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    scale: float | None = None,
    enable_gqa: bool = False,
    impl: str = "auto",
) -> torch.Tensor:
    """softmax(q k^T * scale, top-left causal mask if is_causal) v, computed by the registered impl `impl`, with
    F.scaled_dot_product_attention's signature.

    query (..., Hq, Nq, d) or (B, Nq, d); key, value (..., Hkv, Nk, d) or (B, Nk, d); Hq a multiple of Hkv when
    enable_gqa (as in torch, heads must match without it); scale defaults to 1/sqrt(d). What the kernels do not do
    (attn_mask, dropout_p > 0) is refused with a ValueError naming torch's function, which does.
    impl: "auto" (default, as the nn modules: the Triton kernels on a GPU, PyTorch's SDPA on the CPU, where Triton
    only interprets; `Op.native_impl`) or a registered attention impl. Impl "triton" is the custom op
    fuselab::attention_triton (with autograd), which torch.compile(fullgraph=True) traces without a graph break.
    """
    if attn_mask is not None:
        raise ValueError(
            "fuselab's scaled_dot_product_attention takes no attn_mask (a causal mask is is_causal=True); "
            "for another mask use torch.nn.functional.scaled_dot_product_attention"
        )
    if dropout_p:
        raise ValueError(
            f"fuselab's scaled_dot_product_attention has no dropout (dropout_p={dropout_p!r}); "
            "use torch.nn.functional.scaled_dot_product_attention, or dropout_p=0.0"
        )
    if not enable_gqa and query.dim() >= 4 and key.dim() >= 4 and query.shape[-3] != key.shape[-3]:
        raise ValueError(
            f"query has {query.shape[-3]} heads and key {key.shape[-3]}: pass enable_gqa=True for grouped-query "
            "attention (as torch's function asks)"
        )
    if impl == "auto":
        impl = AUTO["cuda" if query.is_cuda else "cpu"]
    return attention(query, key, value, causal=is_causal, scale=scale, impl=impl)


__all__ = ["scaled_dot_product_attention"]  # what fuselab.nn.functional exposes of this op
