"""Time the attention Triton kernels' plan candidates on this GPU and store the fastest as data.

    fuselab tune attention                                        # bf16 and fp16, d 64 and 128, causal and not
    fuselab tune attention --dtype bf16 --shape 64 --shape 96     # the last dim of each shape is a head dim
    torchrun --nproc-per-node 8 -m fuselab tune attention         # the cases spread over 8 GPUs

For each (dtype, head dim, causal) it times, on a tuning shape that is not one of the benchmark's (N = 3000, batch and
heads making ~16k tokens of hidden 2048), the forward's candidates, then the backward with each dK/dV candidate (dQ at
its rule), then each dQ candidate (dK/dV at the best found). Each candidate is checked against the tiled reference
first; a candidate that fails to compile (shared memory) or is wrong is dropped. Timing: triton.testing.do_bench
(back to back, L2 flushed). The winners go to plans/<device key>.json (fuselab.ops.tuning), which the launchers read
(falling back to the rule for keys absent there).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path

import torch
import triton

from fuselab.bench.accuracy import relative_error
from fuselab.bench.dtypes import dtype_name, parse_dtype
from fuselab.ops import tuning
from fuselab.ops.attention import triton_kernels as tk
from fuselab.ops.attention.spec import reference

Plan = tk.Plan
KERNELS = tk.KERNELS
N = 3000  # the tuning shape's sequence length


def candidates(kernel: str, d: int, dtype: torch.dtype) -> list[Plan]:
    """The rule's plan first, then alternatives around it (tile shapes, warps, stages), without repeats."""
    row = tk.d_work(d) * dtype.itemsize
    plans = [tk.rule_plan(kernel, d, dtype, False)]
    if kernel == "fwd":
        plans += [
            Plan(128, 64, 4, 3),
            Plan(128, 64, 8, 3),
            Plan(128, 128, 8, 3),
            Plan(128, 64, 4, 4),
            Plan(64, 64, 4, 3),
        ]
    elif kernel == "dkdv":
        plans += [Plan(64, 128, 8, 3), Plan(32, 128, 4, 3), Plan(64, 128, 4, 2), Plan(64, 64, 4, 3), Plan(32, 64, 4, 3)]
    else:
        plans += [
            Plan(128, 64, 8, 3),
            Plan(128, 64, 4, 3),
            Plan(128, 32, 4, 3),
            Plan(64, 64, 4, 3),
            Plan(128, 128, 8, 2),
        ]
    if row > 256:  # wide rows: only the smaller tiles can fit
        plans = [p for p in plans if p.block_m * p.block_n <= 64 * 64]
    seen: list[Plan] = []
    for p in plans:
        if p not in seen:
            seen.append(p)
    return seen


def _timed(fn: Callable[[], object]) -> float:
    return triton.testing.do_bench(fn, warmup=10, rep=40)


def tune_case(d: int, dtype: torch.dtype, causal: bool, n: int = N, log: Callable[[str], None] = print) -> dict:
    """Best plans for one (d, dtype, causal) with their times; every candidate's time or error in 'trials'."""
    heads = max(1, 2048 // d)
    batch = max(1, 16384 // n)
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(batch, heads, n, d, device="cuda", generator=gen).to(dtype) for _ in range(3))
    do = torch.randn(batch, heads, n, d, device="cuda", generator=gen).to(dtype)
    scale = d**-0.5
    small = [t[:1, :2, :300] for t in (q, k, v)]
    ref = reference(*(t.double() for t in small), causal=causal)
    trials: dict[str, list] = {"fwd": [], "dkdv": [], "dq": []}
    best: dict[str, Plan] = {}

    def check(plans: dict[str, Plan]) -> None:
        with tk.forced_plans(plans):
            xs = [t.clone().requires_grad_(True) for t in small]
            o, _ = tk.forward(*xs, causal, scale)
            err = relative_error(o, ref)
            if not err < 3e-2:
                raise AssertionError(f"forward error {err:.2e}")
            tk.backward(torch.ones_like(o), *xs, o, tk.forward(*xs, causal, scale)[1], causal, scale)

    for kernel in ("fwd", "dkdv", "dq"):
        for plan in candidates(kernel, d, dtype):
            plans = {**best, kernel: plan}
            try:
                check(plans)
                with tk.forced_plans(plans):
                    if kernel == "fwd":
                        ms = _timed(lambda: tk.forward(q, k, v, causal, scale))
                    else:
                        o, lse = tk.forward(q, k, v, causal, scale)
                        ms = _timed(lambda o=o, lse=lse: tk.backward(do, q, k, v, o, lse, causal, scale))
                trials[kernel].append({**asdict(plan), "ms": ms})
                log(f"  {kernel} {plan}: {ms:.3f} ms")
            except Exception as exc:  # out of shared memory, a compile error, a wrong result: dropped
                trials[kernel].append({**asdict(plan), "error": f"{type(exc).__name__}: {exc}"[:200]})
                log(f"  {kernel} {plan}: {type(exc).__name__}")
        timed = [t for t in trials[kernel] if "ms" in t]
        if timed:
            top = min(timed, key=lambda t: t["ms"])
            best[kernel] = Plan(top["block_m"], top["block_n"], top["warps"], top["stages"])
    return {"best": best, "trials": trials, "shape": [batch, heads, n, d]}


# ---------------------------------------------------------------------------------------------- the tuner protocol

devices = ("cuda",)
default_dtypes = ("bf16", "fp16")
default_shapes = [(64,), (128,)]  # the head dims; of any other shape, its last dimension
CAUSALS = (False, True)


def cases(
    shapes: Sequence[tuple[int, ...]], dtypes: Sequence[torch.dtype], causals: Sequence[bool] = CAUSALS, n: int = N
) -> list[dict]:
    """One case per (dtype, head dim, causal), in that order of nesting; the head dim is each shape's last dimension
    (repeats dropped): {"dtype": "bfloat16", "d": 64, "causal": False, "n": 3000}."""
    if any(len(shape) == 0 for shape in shapes):
        raise ValueError("attention tune: each shape's last dimension is a head dim; got a scalar shape")
    heads = list(dict.fromkeys(int(shape[-1]) for shape in shapes))
    return [
        {"dtype": dtype_name(dtype), "d": d, "causal": causal, "n": n}
        for dtype in dtypes
        for d in heads
        for causal in causals
    ]


def describe(case: dict) -> str:
    return f"{case['dtype']} d={case['d']} causal={case['causal']}"


def cost(case: dict) -> float:
    """Estimated seconds: a compile, a check and a do_bench per candidate of the three kernels."""
    from fuselab.bench.distributed import case_cost

    dtype = parse_dtype(case["dtype"])
    count = sum(len(candidates(kernel, case["d"], dtype)) for kernel in KERNELS)
    return case_cost(impls=count, timing_s=0.1, compiled=count, compile_s=2.0)


def measure(
    case: dict, device: torch.device, quick: bool, compile_peer: bool, log: Callable[[str], None] | None = None
) -> dict:
    """`tune_case` at one case (the stepwise search: forward, then dK/dV, then dQ at the best), on the current GPU;
    `quick` and `compile_peer` do not apply (do_bench's settings are fixed). JSON-able: {"case", "best": {kernel:
    plan as a dict}, "trials", "shape"}."""
    dtype = parse_dtype(case["dtype"])
    result = tune_case(case["d"], dtype, case["causal"], case.get("n", N), log=log or (lambda line: None))
    best = {kernel: asdict(plan) for kernel, plan in result["best"].items()}
    return {"case": case, "best": best, "trials": result["trials"], "shape": result["shape"]}


def summary(measured: dict) -> str:
    parts = []
    for kernel, plan in measured["best"].items():
        ms = min(t["ms"] for t in measured["trials"][kernel] if "ms" in t)  # the best is the fastest
        parts.append(f"{kernel} {Plan(**plan)} {ms:.3f} ms")
    return "; ".join(parts) or "no candidate ran"


def choose(measurements: Sequence[dict]) -> tuple[dict, dict]:
    """The fastest plan of each kernel at each case, by plan key (a later case of the same key wins, as the loop over
    the cases always did): ({plan key: plan as a dict}, evidence: each case's best and trials)."""
    params: dict[str, dict] = {}
    for measured in measurements:
        case = measured["case"]
        for kernel, plan in measured["best"].items():
            params[tk.plan_key(kernel, case["d"], parse_dtype(case["dtype"]), case["causal"])] = plan
    return params, {"cases": [dict(m) for m in measurements]}


def table_key(device: torch.device) -> str:
    return tuning.device_key(device.index) if device.type == "cuda" else device.type


def write(params: dict, evidence: dict, device: torch.device) -> Path:
    """Lay `params` over this GPU's table (plans/<device key>.json, what the launchers read): the keys not tuned this
    time keep their plans, and the cases not tuned this time their evidence (each case names its environment)."""
    key = table_key(device)
    plans = {**tuning.load_table(tk.FOLDER, key), **params}
    environment = {"gpu": torch.cuda.get_device_name(device), "torch": torch.__version__, "triton": triton.__version__}
    cases = [{**c, "environment": environment} for c in evidence["cases"]]
    return tuning.write_table(tk.FOLDER, key, plans, {"cases": merge_cases(earlier_cases(key), cases)})


def earlier_cases(key: str) -> list[dict]:
    """The evidence cases of this GPU's committed table (none without one)."""
    path = tuning.table_path(tk.FOLDER, key)
    if not path.exists():
        return []
    evidence = json.loads(path.read_text()).get("evidence", {})
    return [{"environment": evidence.get("environment"), **c} for c in evidence.get("cases", [])]


def merge_cases(earlier: Sequence[dict], latest: Sequence[dict]) -> list[dict]:
    """`earlier` evidence cases without those `latest` tuned again (same dtype, d, causal), then `latest`."""

    def same(case: dict) -> tuple:
        return case["case"]["dtype"], case["case"]["d"], case["case"]["causal"]

    tuned = {same(c) for c in latest}
    return [c for c in earlier if same(c) not in tuned] + list(latest)
