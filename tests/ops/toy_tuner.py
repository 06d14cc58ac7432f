"""A toy tuner for the CPU tests of `fuselab tune` (the tuner protocol of fuselab.ops.tuning): its measure returns
deterministic synthetic timings per case, and appends the rank that measured each case to the file named by
TOY_TUNER_LOG (if set). It times on the CPU, so the distributed path runs on gloo CPU ranks.

Candidate "narrow" is fastest on small shapes, "wide" on large ones, "middle" never fastest but never far off;
"fragile" fails its check (is absent) past 1000 elements. A shape with a dimension of 13 fails to measure. "middle"
stands for the rules as they stand: a held-out check (`only`, `held_out`) times the winner beside it and drops a
winner more than 1.05x slower there."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence

import torch

from fuselab.bench import distributed
from fuselab.bench.dtypes import dtype_name
from fuselab.ops import tuning

devices = ("cpu",)
default_dtypes = ("fp32",)
CANDIDATES = ("narrow", "middle", "wide", "fragile")


def cases(shapes: Sequence[tuple[int, ...]], dtypes: Sequence[torch.dtype]) -> list[dict]:
    return [{"shape": list(shape), "dtype": dtype_name(dtype)} for dtype in dtypes for shape in shapes]


def cost(case: dict) -> float:
    return float(math.prod(case["shape"]))


def describe(case: dict) -> str:
    return f"toy {case['dtype']} {tuple(case['shape'])}"


def measure(case: dict, device: torch.device, quick: bool, compile_peer: bool, only: Sequence[str] = ()) -> dict:
    if 13 in case["shape"]:
        raise RuntimeError("toy compile error: out of shared memory")
    n = math.prod(case["shape"]) * (2 if case["dtype"] == "float32" else 1)
    timed = {
        "narrow": 0.013 + n * 3.1e-6,
        "middle": 0.021 + n * 2.3e-6,
        "wide": 0.037 + n * 1.7e-6,
        "fragile": 0.011 + n * 1.9e-6,
        "torch": 0.017 + n * 2.9e-6,
    }
    if n > 1000:
        del timed["fragile"]
    if only:
        timed = {k: v for k, v in timed.items() if k in {*only, "middle", "torch"}}
    if os.environ.get("TOY_TUNER_LOG"):
        with open(os.environ["TOY_TUNER_LOG"], "a") as f:
            f.write(json.dumps({"rank": distributed.rank(), "case": case, "only": list(only)}) + "\n")
    return {"case": case, "timed": timed}


def summary(measured: dict) -> str:
    return f"best {min(measured['timed'].values()):.4f} ms"


def choose(measurements: Sequence[dict], held_out: Sequence[dict] = ()) -> tuple[dict, dict]:
    scores = tuning.geomean_scores(CANDIDATES, [(m["timed"], min(m["timed"].values())) for m in measurements])
    winner = tuning.winner(scores, default="")
    evidence: dict = {"winner": winner, "scores": scores, "chosen": [winner]}
    if held_out:
        ratio, case = max(
            (m["timed"].get(winner, tuning.FAILED_RATIO * m["timed"]["middle"]) / m["timed"]["middle"], m["case"])
            for m in held_out
        )  # a winner that fails its check there counts as FAILED_RATIO
        dropped = [winner] if ratio > 1.05 else []
        evidence["checked"] = {"slowest": {winner: {"ratio": ratio, "case": case}}, "dropped": dropped}
        winner = "middle" if dropped else winner
        evidence.update(winner=winner, chosen=[winner])
    return {"candidate": winner}, evidence
