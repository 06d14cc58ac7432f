"""`fuselab tune gelu`: time candidate (block bytes, warps) of the Triton GELU and write this GPU's plan table.

Every candidate runs the package's kernel (unmasked bulk, masked last block) at each tuning shape and dtype (one case,
`measure`), side by side with F.gelu (`benchmark_side_by_side`); over every case's timings (`choose`) the candidate
with the best geometric mean of time / best time wins if it beats the defaults, and its parameters go to
plans/<device key>.json. The table holds block bytes and warps per element size: it applies to every element count.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from fuselab.bench.accuracy import relative_error
from fuselab.bench.dtypes import dtype_name, parse_dtype
from fuselab.ops import tuning
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


def cases(shapes: Sequence[Shape], dtypes: Sequence[torch.dtype]) -> list[dict]:
    """One case per (dtype, shape), dtypes outermost: {"shape": [...], "dtype": "float32"}."""
    return [{"shape": list(shape), "dtype": dtype_name(dtype)} for dtype in dtypes for shape in shapes]


def describe(case: dict) -> str:
    return f"{case['dtype']} {tuple(case['shape'])}"


def cost(case: dict) -> float:
    """Estimated seconds: every candidate and torch timed side by side, plus the bytes they move."""
    from fuselab.bench.distributed import case_cost

    calls = len(CANDIDATES) + 1
    nbytes = 2 * math.prod(case["shape"]) * parse_dtype(case["dtype"]).itemsize
    return case_cost(impls=calls, nbytes=calls * nbytes)


def timing(quick: bool) -> dict:
    return {"warmup_ms": 10, "rep_ms": 20, "min_reps": 3} if quick else {"warmup_ms": 30, "rep_ms": 100}


def measure(case: dict, device: torch.device, quick: bool, compile_peer: bool) -> dict:
    """Time every candidate that passes the check at one (shape, dtype), side by side with F.gelu:
    {"case": case, "timed": {candidate or "torch": median ms}} (a candidate that fails the check is absent)."""
    from fuselab.bench.timer import benchmark_side_by_side
    from fuselab.ops.gelu import triton_kernels as tk

    shape, dtype = tuple(case["shape"]), parse_dtype(case["dtype"])
    (x,) = GELU.make_inputs(shape, dtype, str(device), 0)
    ref = GELU.reference(x[:4096] if x.dim() == 1 else x[:1])
    calls = {}
    for name, overrides in CANDIDATES.items():
        config = plans.gelu_config(dtype.itemsize, None, {**plans.DEFAULTS, **overrides})
        y = tk.gelu_forward(x, True, config)
        err = relative_error(y[:4096] if x.dim() == 1 else y[:1], ref)
        if err <= GELU.tolerance[dtype]:
            calls[name] = functools.partial(tk.gelu_forward, x, True, config)
    calls["torch"] = lambda x=x: F.gelu(x, approximate="tanh")
    timed = {k: m.median_ms for k, m in benchmark_side_by_side(calls, device=device, **timing(quick)).items()}
    return {"case": case, "timed": timed}


def summary(measured: dict) -> str:
    timed = measured["timed"]
    return f"torch {timed['torch']:.4f} ms, best {min(timed.values()):.4f} ms"


def choose(measurements: Sequence[dict]) -> tuple[dict, dict]:
    """The candidate with the best geometric mean over the cases of time / best time there (a candidate that failed
    the check at a case counts as 10x the best), if it beats the defaults: (its parameters, evidence)."""
    scores = tuning.geomean_scores(CANDIDATES, [(m["timed"], min(m["timed"].values())) for m in measurements])
    winner = tuning.winner(scores)
    params = {**plans.DEFAULTS, **CANDIDATES[winner]}
    shapes = dict.fromkeys(tuple(m["case"]["shape"]) for m in measurements)
    return params, {"scores": scores, "winner": winner, "shapes": [list(s) for s in shapes]}
