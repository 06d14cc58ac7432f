"""Attention in PyTorch: matmul, softmax, matmul (naive), F.scaled_dot_product_attention with PyTorch's choice of
backend (sdpa) or one forced (sdpa-flash, sdpa-cudnn, sdpa-efficient), and naive under torch.compile (compile)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from fuselab.bench.sweep import Unavailable
from fuselab.ops.attention.spec import ATTENTION, FLOATS, QKV_RANK, check_qkv, default_scale, repeat_kv

ANY_DEVICE = ("cpu", "cuda")


@ATTENTION.impl("naive", devices=ANY_DEVICE, dtypes=FLOATS, min_dim=QKV_RANK, backward=True)
def attention_naive(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, scale: float | None = None
) -> torch.Tensor:
    """matmul, mask, softmax, matmul in the inputs' dtype: the N x N scores and probabilities go through memory."""
    check_qkv(q, k, v, impl="attention naive")
    k, v = repeat_kv(q, k, v)
    s = torch.matmul(q, k.transpose(-1, -2)) * default_scale(q.shape[-1], scale)
    if causal:
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    return torch.matmul(torch.softmax(s, dim=-1), v)


@ATTENTION.impl(
    "compile", devices=ANY_DEVICE, dtypes=FLOATS, min_dim=QKV_RANK, compiled=True, backward=True, upstream=True
)
def attention_compile(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, scale: float | None = None
) -> torch.Tensor:
    """The naive impl, which the harness wraps in torch.compile per case (Inductor fuses the mask and softmax)."""
    return attention_naive(q, k, v, causal, scale)


def _sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float | None, impl: str, gqa: bool
) -> torch.Tensor:
    shapes = check_qkv(q, k, v, impl=impl)
    if shapes.three_d:  # the fused backends want (B, H, N, d)
        q, k, v = q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1)
    if shapes.hq != shapes.hkv and not gqa:
        k, v = repeat_kv(q, k, v)
    extra = {"enable_gqa": True} if shapes.hq != shapes.hkv and gqa else {}
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, **extra)
    return out.squeeze(1) if shapes.three_d else out


@ATTENTION.impl("sdpa", devices=ANY_DEVICE, dtypes=FLOATS, min_dim=QKV_RANK, backward=True, upstream=True)
def attention_sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, scale: float | None = None
) -> torch.Tensor:
    """F.scaled_dot_product_attention with the backend PyTorch picks (GQA by enable_gqa)."""
    return _sdpa(q, k, v, causal, scale, "attention sdpa", gqa=True)


def _cuda_only(device_type: str) -> str | None:
    return None if device_type == "cuda" else "this SDPA backend runs on CUDA GPUs only"


BACKENDS = {
    "sdpa-flash": ("FLASH_ATTENTION", "FlashAttention-2 kernels (fp16/bf16 only; sm80+)"),
    "sdpa-cudnn": ("CUDNN_ATTENTION", "cuDNN's fused attention (sm80+, a recent cuDNN)"),
    "sdpa-efficient": ("EFFICIENT_ATTENTION", "memory-efficient (xFormers) kernels"),
}


def _forced(name: str, backend: str, about: str) -> Callable[..., torch.Tensor]:
    def fn(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, scale: float | None = None
    ) -> torch.Tensor:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(getattr(SDPBackend, backend)):
            try:
                return _sdpa(q, k, v, causal, scale, f"attention {name}", gqa=False)
            except RuntimeError as exc:  # the forced backend has no kernel for this case (head dim, layout, GPU)
                if "No available kernel" not in str(exc):
                    raise
                about = f"q {tuple(q.shape)}, k {tuple(k.shape)}, {str(q.dtype).removeprefix('torch.')}"
                raise Unavailable(f"attention {name}: PyTorch has no {backend} kernel for {about}") from None

    fn.__name__ = "attention_" + name.replace("-", "_")
    fn.__doc__ = f"F.scaled_dot_product_attention forced to {backend}: {about}; GQA by repeating k/v heads."
    return fn


for _name, (_backend, _about) in BACKENDS.items():
    ATTENTION.impl(
        _name,
        devices=("cuda",),
        requires=_cuda_only,
        backward=True,
        dtypes=(torch.float16, torch.bfloat16) if _name == "sdpa-flash" else FLOATS,
        min_dim=QKV_RANK,
        upstream=True,
    )(_forced(_name, _backend, _about))
