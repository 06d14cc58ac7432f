"""Attention: the spec (reference, inputs, cost model, tolerances) and its impls naive, sdpa (and sdpa-flash,
sdpa-cudnn, sdpa-efficient with the backend forced), compile, tiled (FlashAttention-2 in PyTorch), triton.

Importing registers them all; it needs no GPU and no Triton (each impl says why it is unavailable).
"""

# Registration order is the order tools list the impls in.
# isort: off
from fuselab.ops.attention import naive  # noqa: F401
from fuselab.ops.attention import tiled  # noqa: F401
from fuselab.ops.attention import triton  # noqa: F401

# isort: on
from fuselab.ops.attention.functional import scaled_dot_product_attention
from fuselab.ops.attention.spec import ATTENTION, attention
from fuselab.ops.attention.tiled import FlashAttentionTiled
from fuselab.ops.attention.triton import FlashAttentionTriton

__all__ = ["ATTENTION", "FlashAttentionTiled", "FlashAttentionTriton", "attention", "scaled_dot_product_attention"]
