"""Time the attention Triton kernels' plan candidates on this GPU and store the fastest as data.

    fuselab tune attention                                        # bf16 and fp16, d 64 and 128, causal and not
    fuselab tune attention --dtype bf16 --shape 64 --shape 96     # the last dim of each shape is a head dim
    fuselab tune attention --part fwd                             # the forward's plans only (fwd, dkdv, dq)
    fuselab tune attention --part short                           # the short sequences' plans only (short, long)
    torchrun --nproc-per-node 8 -m fuselab tune attention         # the cases spread over 8 GPUs

For each (dtype, head dim, causal, length class) it times each candidate at three sequence lengths that are not the
benchmark's: for the long class N = 1000, 3000 and 9000, for the short N = 150, 350 and 750 (batch and heads making
~16k tokens of hidden 2048; `--quick`: the middle one alone). The launchers take a short plan for sequences of fewer
than 1000 tokens (tk.n_class), else the long one, else the rule's. A table key holds the candidate of least
geometric-mean time only where it earns its place against the plan that runs without the key (`pick`: 3% less time
overall, nowhere 2% more); else the key is left out (a short key without it, the long class's plan runs). Within a
case the search is stepwise: the forward's candidates, then the backward with each dK/dV candidate (dQ at its plan),
then each dQ candidate (dK/dV at the best found). Each candidate is checked against the reference first; one that
fails to compile (shared memory) or is wrong is dropped. Timing: triton.testing.do_bench's median (back to back, L2
flushed), after a discarded run. The keys go to plans/<device key>.json (fuselab.ops.tuning), laid over what it holds,
which the launchers read.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable, Mapping, Sequence
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
            Plan(64, 64, 4, 2),  # smaller tiles on 2 stages: what short sequences take (docs/ops/attention.md,
            Plan(64, 32, 4, 2),  # session 59)
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


TOLERANCE = 0.02  # a candidate may take up to this much more than the fallback's time at one length and still win
MARGIN = 0.03  # ... if its geometric-mean time is at least this much less than the fallback's


def _plan_of(trial: dict) -> Plan:
    """The plan a trial (a plan's fields with its times or error) timed."""
    return Plan(trial["block_m"], trial["block_n"], trial["warps"], trial["stages"])


def pick(trials: Sequence[dict], fallback: Plan) -> Plan | None:
    """The plan a table key should hold, from one kernel's `trials` (each a plan's fields with "ms", its geometric
    mean over the lengths, and "ms_by_n", or with "error"): the fastest, where it earns its place against `fallback`,
    the plan that runs where the key is absent: at least MARGIN less time overall and nowhere more than TOLERANCE
    more. None: no key (the fallback runs). Without a timed fallback, the fastest; with no trial timed, None."""
    timed = [t for t in trials if "ms" in t]
    if not timed:
        return None
    top = min(timed, key=lambda t: t["ms"])
    best = _plan_of(top)
    base = next((t for t in timed if _plan_of(t) == fallback), None)
    if base is None:
        return best
    if best == fallback or top["ms"] > (1 - MARGIN) * base["ms"]:
        return None
    slower = any(top["ms_by_n"][n] > (1 + TOLERANCE) * base["ms_by_n"][n] for n in base["ms_by_n"])
    return None if slower else best


def _timed(fn: Callable[[], object]) -> float:
    """The median ms of `fn`, back to back, L2 flushed (a median: one late run, a clock still rising, weighs none)."""
    return triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")


def tune_case(
    d: int,
    dtype: torch.dtype,
    causal: bool,
    lengths: Sequence[int] = LENGTHS["long"],
    kernels: Sequence[str] = KERNELS,
    log: Callable[[str], None] = print,
    fallbacks: Mapping[str, Plan] | None = None,
) -> dict:
    """Best plans of `kernels` for one (d, dtype, causal): each candidate's geometric-mean time over `lengths`; every
    candidate's times (or error) in 'trials'. `fallbacks`: by kernel, the plan that runs without a table key of this
    case (default: the rule's), timed first; another is 'best' only where it earns its place (`pick`), else 'best'
    holds None for that kernel. The kernels not tuned keep their current plans meanwhile, and each tuned one its best
    (else its fallback) while the next is tuned."""
    fallbacks = {k: tk.rule_plan(k, d, dtype, causal) for k in KERNELS} | dict(fallbacks or {})
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
    best: dict[str, Plan | None] = {}
    running: dict[str, Plan] = {}  # the plans of the kernels tuned so far: each its best, else its fallback

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

    # A discarded run first (the first launches' costs paid, the clocks up); one that fails is a trial's to report
    if kernels:
        with contextlib.suppress(Exception), tk.forced_plans({k: fallbacks[k] for k in kernels}):
            time_at(kernels[0], *tensors[0])
    for kernel in kernels:
        for plan in dict.fromkeys([fallbacks[kernel], *candidates(kernel, d, dtype)]):
            plans = {**running, kernel: plan}
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
        best[kernel] = pick(trials[kernel], fallbacks[kernel])
        running[kernel] = best[kernel] or fallbacks[kernel]
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
    apply. JSON-able: {"case", "best": {kernel: plan as a dict, or None where no plan earned a key}, "trials",
    "shapes"}."""
    dtype = parse_dtype(case["dtype"])
    lengths = [case["lengths"][len(case["lengths"]) // 2]] if quick else case["lengths"]
    result = tune_case(
        case["d"], dtype, case["causal"], lengths, case["kernels"], log=log or (lambda line: None),
        fallbacks=fallbacks(case, device),
    )  # fmt: skip
    best = {kernel: asdict(plan) if plan else None for kernel, plan in result["best"].items()}
    return {"case": {**case, "lengths": lengths}, "best": best, "trials": result["trials"], "shapes": result["shapes"]}


def fallbacks(case: dict, device: torch.device) -> dict[str, Plan]:
    """By kernel, the plan that runs at `case` without a table key of its length class: for the long class the rule's,
    for another the long class's in the table `device` reads (else the rule's)."""
    dtype = parse_dtype(case["dtype"])
    table = {}
    if case.get("length", "long") != "long" and device.type == "cuda":
        table = tuning.load_table(tk.FOLDER, tuning.reading_key(tk.FOLDER, device.index))
    return {k: tk.table_plan(k, case["d"], dtype, case["causal"], table) for k in KERNELS}


def summary(measured: dict) -> str:
    pieces = []
    for kernel, plan in measured["best"].items():
        if plan is None:
            pieces.append(f"{kernel} no key (none beat the plan that runs without one)")
            continue
        ms = next(t["ms"] for t in measured["trials"][kernel] if "ms" in t and _plan_of(t) == Plan(**plan))
        pieces.append(f"{kernel} {Plan(**plan)} {ms:.3f} ms")
    return "; ".join(pieces) or "no candidate ran"


def choose(measurements: Sequence[dict]) -> tuple[dict, dict]:
    """The best plan of each kernel at each case, by plan key (a later case of the same key wins, as the loop over
    the cases always did), None where no plan earned a key (`pick`): ({plan key: plan as a dict or None}, evidence:
    each case's best and trials)."""
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
    and SM count: `tuning.reading_key`) into its own: the keys not tuned this time keep their plans (a key whose
    plan is None is dropped), and the cases not tuned this time their evidence (each case names its environment)."""
    key = table_key(device)
    read = tuning.reading_key(tk.FOLDER, device.index) if device.type == "cuda" else key
    plans = {k: v for k, v in {**tuning.load_table(tk.FOLDER, read), **params}.items() if v is not None}
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
