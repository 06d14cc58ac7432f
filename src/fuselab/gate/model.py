"""A small GPT built twice, of fuselab's drop-ins (fuselab.nn.GELU, fuselab.nn.Softmax,
fuselab.nn.functional.scaled_dot_product_attention, each with its default impl) and of torch.nn's, with the same
weights: what a user swapping in fuselab's modules would run. The gate compares both against the torch.nn model in
float64, eager and under torch.compile(fullgraph=True)."""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn

VOCAB, DIM, HEADS, LAYERS, BATCH, TOKENS = 50257, 320, 4, 4, 3, 200  # heads of 80, a GPT-2 vocabulary
FLOOR = {torch.float32: 1e-5, torch.bfloat16: 1e-3}  # below this, two models' errors are both rounding


class Block(nn.Module):
    """Pre-norm transformer block: x + proj(attend(qkv(ln1(x)))), then x + down(act(up(ln2(x)))). x: (B, N, dim),
    `heads` heads of dim / heads; attend(q, k, v, is_causal=True) as F.scaled_dot_product_attention, q, k, v
    (B, heads, N, dim / heads)."""

    def __init__(self, dim: int, heads: int, act: nn.Module, attend: Callable[..., torch.Tensor]) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.up, self.down = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.act, self.attend = act, attend

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)  # views
        x = x + self.proj(self.attend(q, k, v, is_causal=True).transpose(1, 2).reshape(b, n, d))
        return x + self.down(self.act(self.up(self.ln2(x))))


class GPT(nn.Module):
    """tokens (B, N) -> next-token probabilities (B, N, VOCAB), through LAYERS blocks and a softmax."""

    def __init__(self, act: Callable[[], nn.Module], softmax: nn.Module, attend: Callable[..., torch.Tensor]) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(Block(DIM, HEADS, act(), attend) for _ in range(LAYERS))
        self.ln, self.head, self.softmax = nn.LayerNorm(DIM), nn.Linear(DIM, VOCAB), softmax

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.softmax(self.head(self.ln(x)))


def torch_model() -> GPT:
    return GPT(nn.GELU, nn.Softmax(dim=-1), nn.functional.scaled_dot_product_attention)


def fuselab_model(like: GPT) -> GPT:
    """`like` with its GELUs, softmax and attention swapped for fuselab's (weights shared by copy)."""
    import fuselab.nn

    model = copy.deepcopy(like)
    for block in model.blocks:
        block.act, block.attend = fuselab.nn.GELU(), fuselab.nn.functional.scaled_dot_product_attention
    model.softmax = fuselab.nn.Softmax(dim=-1)
    return model


def loss_and_grads(model: nn.Module, tokens: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, list]:
    """The mean negative log-likelihood of `targets` (float64) and the gradient of every parameter."""
    model.zero_grad(set_to_none=True)
    probs = model(tokens)
    loss = -probs.gather(-1, targets[..., None]).float().clamp_min(1e-30).log().mean()
    loss.backward()
    return loss.detach().double(), [p.grad for p in model.parameters()]


def compare_models(dtype: torch.dtype, compiled: bool, device: str = "cuda") -> tuple[float, float, str]:
    """(fuselab's error, what it must stay under, what was compared): the loss and every parameter's gradient of
    both models in `dtype`, each against the torch.nn model in float64; fuselab's must be within twice torch's."""
    from fuselab.bench.accuracy import gradient_error

    torch.manual_seed(0)
    base = torch_model().to(device)
    gen = torch.Generator(device=device).manual_seed(1)
    tokens = torch.randint(0, VOCAB, (BATCH, TOKENS), generator=gen, device=device)
    targets = torch.randint(0, VOCAB, (BATCH, TOKENS), generator=gen, device=device)
    loss64, grads64 = loss_and_grads(copy.deepcopy(base).double(), tokens, targets)
    errors = {}
    for name, model in (("torch.nn", copy.deepcopy(base)), ("fuselab", fuselab_model(base))):
        model = model.to(dtype)
        run = torch.compile(model, fullgraph=True) if compiled else model
        loss, grads = loss_and_grads(run, tokens, targets)
        loss_err = abs(loss.item() - loss64.item()) / abs(loss64.item())
        errors[name] = max(loss_err, gradient_error(grads, grads64))
    bound = 2 * errors["torch.nn"] + FLOOR[dtype]
    what = (
        f"{LAYERS} blocks, heads of {DIM // HEADS}, vocabulary {VOCAB}, {BATCH}x{TOKENS} tokens: loss and parameter "
        f"gradients against torch.nn in float64; torch.nn's own error {errors['torch.nn']:.3g}, bound 2x that + "
        f"{FLOOR[dtype]:g}"
    )
    return errors["fuselab"], bound, what
