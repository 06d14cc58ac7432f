"""Time the attention Triton kernels' plan candidates on this GPU and store the fastest as data.

    fuselab tune attention                                        # bf16 and fp16, d 64 and 128, causal and not
    fuselab tune attention --dtype bf16 --shape 64 --shape 96     # the last dim of each shape is a head dim
    fuselab tune attention --part fwd                             # the forward's plans only (fwd, dkdv, dq)
    fuselab tune attention --part short                           # the short sequences' plans only (short, long)
    torchrun --nproc-per-node 8 -m fuselab tune attention         # the cases spread over 8 GPUs

For each (dtype, head dim, causal, length class) it times each candidate at three sequence lengths that are not the
benchmark's and keeps the one of least geometric-mean time: for the long class N = 1000, 3000 and 9000, for the short
N = 150, 350 and 750 (batch and heads making ~16k tokens of hidden 2048; `--quick`: the middle one alone). The
launchers take a short plan for sequences of fewer than 1000 tokens (tk.n_class), else the long one. Within a case the
search is stepwise: the forward's candidates, then the backward with each dK/dV candidate (dQ at its plan), then each
dQ candidate (dK/dV at the best found). Each candidate is checked against the reference first; a candidate that fails
to compile (shared memory) or is wrong is dropped. Timing: triton.testing.do_bench (back to back, L2 flushed). The
winners go to plans/<device key>.json (fuselab.ops.tuning), laid over what it holds, which the launchers read (falling
back to the long class's plan, then to the rule, for keys absent there).
"""

from __future__ import annotations

import json
import math
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
N = 3000  # the long class's middle sequence length (`--quick`: the only one)
LENGTHS = {"long": (tk.SHORT_BELOW, N, 9000), "short": (150, 350, 750)}  # tokens, by length class (tk.n_class)
PARTS = (*KERNELS, *LENGTHS)  # what `fuselab tune attention --part` may name: kernels, length classes
parts = PARTS  # (the tuner protocol's name)


def candidates(kernel: str, d: int, dtype: torch.dtype) -> list[Plan]:
    """The rule's plan first, then alternatives around it (tile shapes, warps, stages), without repeats."""
    row = tk.d_work(d) * dtype.itemsize
    plans = [tk.rule_plan(kernel, d, dtype, False)]
    if kernel == "fwd":
        plans += [
            Plan(128, 64, 4, 3),
            Plan(128, 64, 8, 3),
            Plan(128, 128, 8, 3),
            Plan(64, 64, 4, 3),
            Plan(64, 128, 4, 2),
            Plan(64, 128, 4, 3),
        ]
    elif kernel == "dkdv":
        # (spill-free tiles of 16 x 64 on 4 warps and 32 x 64 on 8 took 1.1-2.2x the winners' time on the H200:
        # docs/ops/attention.md, "The dK/dV kernel's registers")
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
        if kernel == "dkdv":  # fewer keys, fewer accumulators (scripts/attention_plan_sweep.py; docs/ops/attention.md)
            plans += [Plan(32, 64, 4, 1), Plan(32, 32, 4, 2), Plan(32, 16, 4, 2)]
    seen: list[Plan] = []
    for p in plans:
        if p not in seen:
            seen.append(p)
    return seen


def _timed(fn: Callable[[], object]) -> float:
    return triton.testing.do_bench(fn, warmup=10, rep=40)


def tune_case(
    d: int,
    dtype: torch.dtype,
    causal: bool,
    lengths: Sequence[int] = LENGTHS["long"],
    kernels: Sequence[str] = KERNELS,
    log: Callable[[str], None] = print,
) -> dict:
    """Best plans of `kernels` for one (d, dtype, causal): each candidate's geometric-mean time over `lengths`; every
    candidate's times (or error) in 'trials'; the kernels not tuned keep their current plans meanwhile."""
    heads = max(1, 2048 // d)
    gen = torch.Generator(device="cuda").manual_seed(0)
    tensors = []
    for n in lengths:
        q, k, v, do = (
            torch.randn(max(1, 16384 // n), heads, n, d, device="cuda", generator=gen).to(dtype) for _ in "qkvo"
        )
        tensors.append((q, k, v, do))
    scale = d**-0.5
    small = [t[:1, :2, :300] for t in tensors[0][:3]]
    ref = reference(*(t.double() for t in small), causal=causal)
    trials: dict[str, list] = {kernel: [] for kernel in kernels}
    best: dict[str, Plan] = {}

    def check(plans: dict[str, Plan]) -> None:
        with tk.forced_plans(plans):
            xs = [t.clone().requires_grad_(True) for t in small]
            o, _ = tk.forward(*xs, causal, scale)
            err = relative_error(o, ref)
            if not err < 3e-2:
                raise AssertionError(f"forward error {err:.2e}")
            tk.backward(torch.ones_like(o), *xs, o, tk.forward(*xs, causal, scale)[1], causal, scale)

    def time_at(kernel: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor) -> float:
        if kernel == "fwd":
            return _timed(lambda: tk.forward(q, k, v, causal, scale))
        o, lse = tk.forward(q, k, v, causal, scale)
        return _timed(lambda: tk.backward(do, q, k, v, o, lse, causal, scale))

    for kernel in kernels:
        for plan in candidates(kernel, d, dtype):
            plans = {**best, kernel: plan}
            try:
                check(plans)
                with tk.forced_plans(plans):
                    times = [time_at(kernel, *t) for t in tensors]
                ms = math.prod(times) ** (1 / len(times))
                trials[kernel].append(
                    {**asdict(plan), "ms": ms, "ms_by_n": dict(zip(map(str, lengths), times, strict=True))}
                )
                log(f"  {kernel} {plan}: {ms:.3f} ms (geomean over N = {', '.join(map(str, lengths))})")
            except Exception as exc:  # out of shared memory, a compile error, a wrong result: dropped
                trials[kernel].append({**asdict(plan), "error": f"{type(exc).__name__}: {exc}"[:200]})
                log(f"  {kernel} {plan}: {type(exc).__name__}")
        timed = [t for t in trials[kernel] if "ms" in t]
        if timed:
            top = min(timed, key=lambda t: t["ms"])
            best[kernel] = Plan(top["block_m"], top["block_n"], top["warps"], top["stages"])
    return {"best": best, "trials": trials, "shapes": [list(t[0].shape) for t in tensors]}


# ---------------------------------------------------------------------------------------------- the tuner protocol

devices = ("cuda",)
default_dtypes = ("bf16", "fp16")
default_shapes = [(64,), (128,)]  # the head dims; of any other shape, its last dimension
CAUSALS = (False, True)


def cases(
    shapes: Sequence[tuple[int, ...]],
    dtypes: Sequence[torch.dtype],
    causals: Sequence[bool] = CAUSALS,
    parts: Sequence[str] = PARTS,
) -> list[dict]:
    """One case per (dtype, head dim, causal, length class), in that order of nesting; the head dim is each shape's
    last dimension (repeats dropped); `parts`: the kernels to tune and the length classes to tune them at (of those it
    names none: all). {"dtype": "bfloat16", "d": 64, "causal": False, "length": "long", "lengths": [1000, 3000,
    9000], "kernels": ["fwd", "dkdv", "dq"]}."""
    unknown = [p for p in parts if p not in PARTS]
    if unknown or not parts:
        raise ValueError(f"attention tune: parts are {', '.join(PARTS)}; got {', '.join(unknown) or 'none'}")
    if any(len(shape) == 0 for shape in shapes):
        raise ValueError("attention tune: each shape's last dimension is a head dim; got a scalar shape")
    heads = list(dict.fromkeys(int(shape[-1]) for shape in shapes))
    kernels = [p for p in parts if p in KERNELS] or list(KERNELS)
    classes = [p for p in parts if p in LENGTHS] or list(LENGTHS)
    return [
        {"dtype": dtype_name(dtype), "d": d, "causal": causal, "length": length, "lengths": list(LENGTHS[length]),
         "kernels": kernels}
        for dtype in dtypes
        for d in heads
        for causal in causals
        for length in classes
    ]  # fmt: skip


def describe(case: dict) -> str:
    return f"{case['dtype']} d={case['d']} causal={case['causal']} {case.get('length', 'long')} sequences"


def cost(case: dict) -> float:
    """Estimated seconds: a compile and a check per candidate of the case's kernels, a do_bench per length."""
    from fuselab.bench.distributed import case_cost

    dtype = parse_dtype(case["dtype"])
    count = sum(len(candidates(kernel, case["d"], dtype)) for kernel in case["kernels"])
    return case_cost(impls=count * len(case["lengths"]), timing_s=0.1, compiled=count, compile_s=2.0)


def measure(
    case: dict, device: torch.device, quick: bool, compile_peer: bool, log: Callable[[str], None] | None = None
) -> dict:
    """`tune_case` at one case (the stepwise search: forward, then dK/dV, then dQ at the best, of the case's kernels),
    on the current GPU; `quick`: at the class's middle length alone (N = 3000 for the long); `compile_peer` does not
    apply. JSON-able: {"case", "best": {kernel: plan as a dict}, "trials", "shapes"}."""
    dtype = parse_dtype(case["dtype"])
    lengths = [case["lengths"][len(case["lengths"]) // 2]] if quick else case["lengths"]
    result = tune_case(case["d"], dtype, case["causal"], lengths, case["kernels"], log=log or (lambda line: None))
    best = {kernel: asdict(plan) for kernel, plan in result["best"].items()}
    return {"case": {**case, "lengths": lengths}, "best": best, "trials": result["trials"], "shapes": result["shapes"]}


def summary(measured: dict) -> str:
    pieces = []
    for kernel, plan in measured["best"].items():
        ms = min(t["ms"] for t in measured["trials"][kernel] if "ms" in t)  # the best is the fastest
        pieces.append(f"{kernel} {Plan(**plan)} {ms:.3f} ms")
    return "; ".join(pieces) or "no candidate ran"


def choose(measurements: Sequence[dict]) -> tuple[dict, dict]:
    """The fastest plan of each kernel at each case, by plan key (a later case of the same key wins, as the loop over
    the cases always did): ({plan key: plan as a dict}, evidence: each case's best and trials)."""
    params: dict[str, dict] = {}
    for measured in measurements:
        case = measured["case"]
        for kernel, plan in measured["best"].items():
            key = tk.plan_key(kernel, case["d"], parse_dtype(case["dtype"]), case["causal"], case.get("length", "long"))
            params[key] = plan
    return params, {"cases": [dict(m) for m in measurements]}


def table_key(device: torch.device) -> str:
    return tuning.device_key(device.index) if device.type == "cuda" else device.type


def write(params: dict, evidence: dict, device: torch.device) -> Path:
    """Lay `params` over the table this GPU reads (its own, plans/<device key>.json, or that of a GPU of its capability
    and SM count: `tuning.reading_key`) into its own: the keys not tuned this time keep their plans, and the cases not
    tuned this time their evidence (each case names its environment)."""
    key = table_key(device)
    read = tuning.reading_key(tk.FOLDER, device.index) if device.type == "cuda" else key
    plans = {**tuning.load_table(tk.FOLDER, read), **params}
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
    """`earlier` evidence cases, less the kernels `latest` tuned again at the same (dtype, d, causal) (a case left
    with none is dropped), then `latest`."""

    def same(case: dict) -> tuple:
        return case["case"]["dtype"], case["case"]["d"], case["case"]["causal"], case["case"].get("length", "long")

    retuned: dict[tuple, set[str]] = {}
    for c in latest:
        retuned.setdefault(same(c), set()).update(c["case"].get("kernels", KERNELS))
    kept = []
    for c in earlier:
        gone = retuned.get(same(c), set())
        left = [k for k in c.get("trials", {}) if k not in gone]
        if same(c) not in retuned:
            kept.append(c)
        elif left:
            best = {k: v for k, v in c.get("best", {}).items() if k in left}
            kept.append({**c, "best": best, "trials": {k: c["trials"][k] for k in left}})
    return kept + list(latest)
