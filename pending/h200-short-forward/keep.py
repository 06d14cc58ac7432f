"""Keep only the tuned short forward keys that are not slower at held-out shapes (run on the device after the tune).

    PYTHONPATH=src python3 pending/h200-short-forward/keep.py BEFORE.jsonl AFTER.jsonl TABLE.json OUT.json

BEFORE: the plan sweep on the table before the tune ("plan": the long class's plan, beside forced candidates); AFTER:
the same shapes on the tuned table. A shape's ratio is the tuned key's time over the old plan's: side by side from
BEFORE where the tuned plan is one of its forced columns, else each sweep's own time over its cuDNN time. A new short
key is dropped if any of its held-out shapes took more than 1.02x, or their geomean is not below 1.0. OUT: TABLE
without the dropped keys (its evidence kept).
"""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

import torch

from fuselab.ops.attention import triton_kernels as tk


def _plan(text: str) -> str:
    """'Plan(block_m=64, block_n=32, warps=4, stages=2)' -> '64x32x4x2'."""
    return "x".join(re.findall(r"=(\d+)", text))


def main(before_path: str, after_path: str, table_path: str, out_path: str) -> None:
    before = {(tuple(r["shape"]), r["causal"]): r for r in map(json.loads, Path(before_path).read_text().splitlines())}
    ratios: dict[str, list[float]] = {}
    for r in map(json.loads, Path(after_path).read_text().splitlines()):
        b = before.get((tuple(r["shape"]), r["causal"]))
        if b is None or "plan" not in r["ms"] or "plan" not in b["ms"]:
            continue
        d, nq, nk = r["shape"][5], r["shape"][3], r["shape"][4]
        key = tk.plan_key("fwd", d, torch.bfloat16, r["causal"], tk.n_class(nq, nk))
        old, new = _plan(b["own_plans"]["fwd"]), _plan(r["own_plans"]["fwd"])
        if old == new:
            print(f"{r['shape']} causal={r['causal']}: {key} unchanged ({old})")
            continue
        forced = b["ms"].get(f"fwd {new}")
        if forced is not None:
            ratio, how = forced / b["ms"]["plan"], "side by side"
        else:
            ratio = (r["ms"]["plan"] / r["ms"]["sdpa-cudnn"]) / (b["ms"]["plan"] / b["ms"]["sdpa-cudnn"])
            how = "over cuDNN"
        ratios.setdefault(key, []).append(ratio)
        print(
            f"{r['shape']} causal={r['causal']}: {key} {old} -> {new} {ratio:.3f} ({how}; after, over cuDNN: "
            f"{r['ms']['plan'] / r['ms']['sdpa-cudnn']:.3f})"
        )
    table = json.loads(Path(table_path).read_text())
    for key in [k for k in table["params"] if k.startswith("fwd|") and k.endswith("|short")]:
        got = ratios.get(key, [])
        geomean = math.exp(sum(map(math.log, got)) / len(got)) if got else float("nan")
        keep = bool(got) and max(got) <= 1.02 and geomean < 1.0
        print(
            f"{key} {table['params'][key]}: {len(got)} held-out shapes, geomean {geomean:.3f}, "
            f"worst {max(got, default=float('nan')):.3f}: {'kept' if keep else 'dropped'}"
        )
        if not keep:
            del table["params"][key]
    Path(out_path).write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:5])
