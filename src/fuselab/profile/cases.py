"""The lecture's profiling cases, one name each: `fuselab profile --case matmul2048`.

Each case makes its inputs once (seeded, on the device) and returns a callable to profile. Sizes are the
lecture's on a GPU and smaller on the CPU, where the point is to see the operators, not the speed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from fuselab.profile.runahead import MLPConfig, make_mlp


@dataclass(frozen=True)
class Case:
    name: str
    doc: str
    make: Callable[[str], Callable[[], object]]  # device -> the callable to profile


def _randn(*shape: int, device: str, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).to(device)


def _big(device: str) -> bool:
    return torch.device(device).type == "cuda"


def _add(device: str) -> Callable[[], object]:
    n = 2**24 if _big(device) else 2**20
    a, b = _randn(n, device=device, seed=0), _randn(n, device=device, seed=1)
    return lambda: a + b


def _matmul(n: int) -> Callable[[str], Callable[[], object]]:
    def make(device: str) -> Callable[[], object]:
        a, b = _randn(n, n, device=device, seed=0), _randn(n, n, device=device, seed=1)
        return lambda: a @ b

    return make


def _cdist(device: str) -> Callable[[], object]:
    m, d = (4096, 128) if _big(device) else (512, 32)
    x, y = _randn(m, d, device=device, seed=0), _randn(m, d, device=device, seed=1)
    return lambda: torch.cdist(x, y)


def _gelu_add(device: str) -> Callable[[], object]:
    n = 2**24 if _big(device) else 2**20
    a, b = _randn(n, device=device, seed=0), _randn(n, device=device, seed=1)
    return lambda: F.gelu(a + b, approximate="tanh")


def _softmax_add(device: str) -> Callable[[], object]:
    rows, cols = (4096, 4096) if _big(device) else (256, 1024)
    a, b = _randn(rows, cols, device=device, seed=0), _randn(rows, cols, device=device, seed=1)
    return lambda: torch.softmax(a + b, dim=-1)


def _mlp(device: str) -> Callable[[], object]:
    size = 1024 if _big(device) else 128
    model, opt, x, y = make_mlp(MLPConfig(layers=4, dim=size, batch=size, device=device))

    def step() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss

    return step


CASES: dict[str, Case] = {
    c.name: c
    for c in (
        Case("add", "a + b, 2^24 float32 (one elementwise kernel)", _add),
        Case("matmul2048", "a @ b, 2048 x 2048 float32 (a cuBLAS GEMM, compute bound)", _matmul(2048)),
        Case("matmul128", "a @ b, 128 x 128 float32 (launch bound: the CPU time dwarfs the kernel)", _matmul(128)),
        Case("cdist", "torch.cdist(x, y), 4096 x 128 points (one call, several kernels)", _cdist),
        Case("gelu_add", "F.gelu(a + b, approximate='tanh'), 2^24 (two kernels, two trips to memory)", _gelu_add),
        Case("softmax_add", "torch.softmax(a + b, -1), 4096 x 4096 (add kernel, then softmax kernel)", _softmax_add),
        Case("mlp", "one training step of a 4-layer MLP, 1024 wide, batch 1024 (forward, backward, SGD)", _mlp),
    )
}


def get_case(name: str) -> Case:
    if name not in CASES:
        raise ValueError(f"unknown case {name!r}; known cases: {', '.join(CASES)}")
    return CASES[name]
