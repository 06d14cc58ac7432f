"""`fuselab tune gelu`: time candidate (block bytes, warps) of the Triton GELU and write this GPU's plan table.

Every candidate runs the package's kernel (unmasked bulk, masked last block) at each tuning shape, side by side with
F.gelu (`benchmark_side_by_side`); the candidate with the best geometric mean of time / best time wins if it beats
the defaults, and its parameters go to plans/<device key>.json. The table holds block bytes and warps per element
size: it applies to every element count.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from fuselab.ops.evaluate import relative_error
from fuselab.ops.gelu import plans
from fuselab.ops.gelu.spec import GELU

Shape = tuple[int, ...]

CANDIDATES: dict[str, dict] = {
    "defaults": {},
    **{
        f"{kib} KiB, {w} warps": {"block_bytes": kib * 1024, "warps": {"4": w, "2": w}}
        for kib in (2, 4, 8, 16)
        for w in (4, 8, 16)
    },
}


def run(
    shapes: Sequence[Shape], dtypes: Sequence[torch.dtype], device: torch.device, quick: bool, compile_peer: bool
) -> tuple[dict, dict]:
    """Tune over `shapes` x `dtypes`: (the winning parameters, evidence)."""
    from fuselab.bench.timer import benchmark_side_by_side
    from fuselab.ops.gelu import triton_kernels as tk

    timing = {"warmup_ms": 10, "rep_ms": 20, "min_reps": 3} if quick else {"warmup_ms": 30, "rep_ms": 100}
    logs: dict[str, list[float]] = {name: [] for name in CANDIDATES}
    for dtype in dtypes:
        for shape in shapes:
            (x,) = GELU.make_inputs(tuple(shape), dtype, str(device), 0)
            ref = GELU.reference(x[:4096] if x.dim() == 1 else x[:1])
            calls = {}
            for name, overrides in CANDIDATES.items():
                config = plans.gelu_config(dtype.itemsize, None, {**plans.DEFAULTS, **overrides})
                y = tk.gelu_forward(x, True, config)
                err = relative_error(y[:4096] if x.dim() == 1 else y[:1], ref)
                if err <= GELU.tolerance[dtype]:
                    calls[name] = functools.partial(tk.gelu_forward, x, True, config)
            calls["torch"] = lambda x=x: F.gelu(x, approximate="tanh")
            timed = {k: m.median_ms for k, m in benchmark_side_by_side(calls, device=device, **timing).items()}
            best = min(timed.values())
            for name in CANDIDATES:
                logs[name].append(math.log(timed.get(name, 10 * best) / best))
            print(f"{str(dtype).removeprefix('torch.')} {shape}: torch {timed['torch']:.4f} ms, best {best:.4f} ms")
    scores = {name: math.exp(sum(v) / len(v)) for name, v in logs.items()}
    winner = min(scores, key=scores.get)
    if scores[winner] >= scores["defaults"]:
        winner = "defaults"
    params = {**plans.DEFAULTS, **CANDIDATES[winner]}
    return params, {"scores": scores, "winner": winner, "shapes": [list(s) for s in shapes]}
