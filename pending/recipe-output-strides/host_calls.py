"""recipe-output-strides: host µs a call of attention's forward (Triton, eager, no grad) on q, k, v sliced from one
projection (O in q's order) and on contiguous ones, replays on and off; a small shape, so the host bounds the loop."""

import time

import torch

from fuselab.ops import launcher
from fuselab.ops.attention.triton import attention_triton as fused

B, N, H, d = 2, 64, 4, 64
qkv = torch.randn(B, N, 3, H, d, device="cuda", dtype=torch.bfloat16)
sliced = [t.transpose(1, 2) for t in qkv.unbind(2)]
contiguous = [t.contiguous() for t in sliced]


def host_us(args: list, n: int = 2000) -> float:
    for _ in range(20):
        fused(*args, True)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fused(*args, True)
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6


for replays in (True, False):
    with launcher.enabled(replays):
        for name, args in (("sliced", sliced), ("contiguous", contiguous)):
            print(
                f"replays {'on ' if replays else 'off'} {name:10} {min(host_us(args) for _ in range(3)):7.1f} us/call"
            )
print("O strides (sliced):", fused(*sliced, True).stride(), "replayer keys held:", fused._replayer.size())
