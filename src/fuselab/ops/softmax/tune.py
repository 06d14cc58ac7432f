"""`fuselab tune softmax`: time candidate rule parameters of the Triton softmax and write this GPU's plan table.

Each candidate is a set of overrides of the GPU's rules as they stand (its plan table over plans.DEFAULTS: the rules'
parameters: tile bytes, warps per element size, register caps and held rows by compiled tile, split spans, the looped
step, the tiles of rows read with edges or element by element). For every tuning shape and dtype (one case,
`measure`), the launches the candidates make (`launched_plan`, deduplicated) are checked against the float64
reference, then timed side by side with torch.softmax (and torch.compile unless --no-compile;
`benchmark_side_by_side`). A candidate's score is the geometric mean over the cases of its launch's time over the
best time there; the candidates that beat the rules as they stand are taken together where they do not meet
(`combine`) and written to plans/<device key>.json. The table holds parameters, never a plan per tuned width, so the
rules still decide for shapes never tuned. Tune on one random draw (--seed), check on another (`fuselab bench softmax
--shapes random:N --seed S`).

The candidates keep what the exploration of 2026-11 (docs/ops/softmax.md) found worth trying again on another GPU.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch

from fuselab.bench.accuracy import relative_error
from fuselab.bench.dtypes import dtype_name, parse_dtype
from fuselab.ops import tuning
from fuselab.ops.softmax import launch, plans
from fuselab.ops.softmax.spec import SOFTMAX

Shape = tuple[int, ...]

H200 = tuning.load_table(plans.FOLDER, tuning.key_of("NVIDIA H200", 9, 0))  # register caps, held rows, row ahead

CANDIDATES: dict[str, dict] = {
    "defaults": {},
    "the H200's table": dict(H200),
    "tile 2 KiB": {"tile_bytes": {"4": 2048, "2": 2048}},
    "tile 8 KiB": {"tile_bytes": {"4": 8192, "2": 8192}},
    "tile 2 KiB 16-bit": {"tile_bytes": {"4": 4096, "2": 2048}},
    "short warps x2": {"short_warps": {"4": 2, "2": 8}},
    "short warps /2": {"short_warps": {"4": 1, "2": 2}},
    "mid 8 warps": {"mid_warps": 8},
    "wide 8 warps": {"wide_warps": {"4": 8, "2": 8}, "widest_fp32": [16384, 16]},
    "wide fp32 8 warps": {"wide_warps": {"4": 8, "2": 16}, "widest_fp32": [16384, 16]},
    "wide 32 warps": {"wide_warps": {"4": 32, "2": 32}},
    "the H200's register caps": {"maxnreg": H200["maxnreg"]},
    "caps at 48": {"maxnreg": {key: [warps, 48] for key, (warps, _) in H200["maxnreg"].items()}},
    "the H200's held bf16": {"held_bf16": H200["held_bf16"]},
    "held bf16 from 8192": {"held_bf16": {**H200["held_bf16"], "8192": [8, None]}},
    "the H200's fp16 row ahead": {"ahead": H200["ahead"]},
    "row max 16384": {"row_max": 16384},
    "split fp32 8192": {"split": {"4": [8192, 16], "2": [8192, 8]}},
    "split 16-bit 16384": {"split": {"4": [16384, 16], "2": [16384, 16]}},
    "split pairs 8 warps": {"split_pairs": [8192, 8]},
    "split pairs 16384": {"split_pairs": [16384, 8]},
    "split fill 3 per SM": {"split_fill": [3, 4096]},
    "split fill 6 per SM": {"split_fill": [6, 4096]},
    "loop 8192": {"loop": [8192, 16]},
    "no edges": {"edge_min_bytes": 2**40},
    # Where the committed draw (docs/ops/softmax.md) lost: rows read element by element (millions of rows of 5-12),
    # rows read with edges, few small tiles, fp32 rows of 8193-16 384 and past row_max
    "scalar tile 256 x 2": {"scalar_tile": [256, 2]},
    "scalar tile 1024 x 4": {"scalar_tile": [1024, 4]},
    "scalar tile 1024 x 8": {"scalar_tile": [1024, 8]},
    "scalar tile 2048 x 8": {"scalar_tile": [2048, 8]},
    "scalar tile 2048 x 16": {"scalar_tile": [2048, 16]},
    "scalar wide 2 warps": {"scalar_wide": [64, 2]},
    "scalar wide from 32": {"scalar_wide": [32, 1]},
    "scalar grow 16 a thread, 16 per SM": {"scalar_grow": [16, 16]},
    "scalar grow 32 a thread, 16 per SM": {"scalar_grow": [32, 16]},
    "edge warp 2 KiB": {"edge_warp_bytes": 2048},
    "edge warp 8 KiB": {"edge_warp_bytes": 8192},
    "fill 3 warps per SM": {"fill_warps_per_sm": 3},
    "fill 12 warps per SM": {"fill_warps_per_sm": 12},
    "widest fp32 from 32768": {"widest_fp32": [32768, 32]},
    "row max 65536": {"row_max": 65536},
}


def candidate_params(overrides: dict, base: dict | None = None) -> dict:
    """A candidate's rules: its overrides over `base` (the GPU's rules as they stand; None: plans.DEFAULTS)."""
    return {**(base or plans.DEFAULTS), **overrides}


def tune_shape(
    shape: Shape,
    dtype: torch.dtype,
    device: torch.device,
    compile_peer: bool,
    timing: dict,
    names: Sequence[str] | None = None,
) -> dict[str, object]:
    """Time the distinct plans of every candidate (or of `names`, with "defaults") at `shape` beside the peers;
    returns {"plans": {plan: ms or error}, "by_candidate": {name: plan}, "peers": {name: ms}}, each plan named by its
    repr."""
    from fuselab.bench.compiled import WatchedCompile
    from fuselab.bench.timer import benchmark_side_by_side

    rows = shape[0]
    (x,) = SOFTMAX.make_inputs(shape, dtype, str(device), 0)
    check = slice(0, min(rows, 64))
    ref = SOFTMAX.reference(x[check])
    sms = launch.sm_count(device.index) if launch.can_wait(device) else None
    y = torch.empty_like(x)
    base = launch.params(device)  # this GPU's table over the defaults: a candidate changes it, never drops it
    named = CANDIDATES if names is None else {n: CANDIDATES[n] for n in dict.fromkeys(["defaults", *names])}
    by_candidate = {name: launched_plan(x, y, candidate_params(o, base), sms) for name, o in named.items()}
    # each launch with the rules of the first candidate that makes it (reversed: the first one written last wins)
    rules = {launched: candidate_params(CANDIDATES[name], base) for name, launched in reversed(by_candidate.items())}
    calls: dict[object, Callable[[], object]] = {}
    results: dict[object, object] = {}
    for launched in dict.fromkeys(by_candidate.values()):
        y.fill_(float("nan"))
        plan = launched.plan
        try:
            launch.launch_forward(x, y, plan, rules[launched])
            err = relative_error(y[check], ref)
        except Exception as exc:  # a plan that cannot run here is reported, not fatal
            results[launched] = f"{type(exc).__name__}: {exc}"[:200]
            continue
        if err <= SOFTMAX.tolerance[dtype]:
            calls[launched] = functools.partial(launch.launch_forward, x, y, plan, rules[launched])
        else:
            results[launched] = f"rel err {err:.2e}"
    calls["torch"] = lambda: torch.softmax(x, dim=-1)
    if compile_peer:
        compiled = WatchedCompile(SOFTMAX.get_impl("compile").fn)
        calls["compile"] = lambda: compiled(x)
    timed = benchmark_side_by_side(calls, device=device, **timing)
    results.update({k: m.median_ms for k, m in timed.items()})
    peers = {k: results.pop(k) for k in ("torch", "compile") if k in results}
    return {  # plans by their repr (JSON keys): one string per distinct launch
        "plans": {str(launched): v for launched, v in results.items()},
        "by_candidate": {name: str(launched) for name, launched in by_candidate.items()},
        "peers": peers,
        "base": base,
    }


@dataclass(frozen=True)
class Launched:
    """What a candidate's rules make the launcher run on one tensor: the plan (rows per program as launched, after
    `plans.fill_rows`; a split row's spans after `plans.split_chunk`), how rows are read (plans.READS: "edges" turns
    on the kernel's edge path)."""

    plan: plans.Plan
    reads: str

    def __str__(self) -> str:
        return f"{self.plan!r} reads={self.reads}"


def launched_plan(x: torch.Tensor, y: torch.Tensor, p: dict, sms: int | None) -> Launched:
    """The forward launch rules `p` give x -> y, as the launcher makes it (`launch._prepare_forward`): how rows are
    read, the plan for them, and a small tensor's rows per program (where programs can wait: `sms`)."""
    read = launch.reads(x, y, min_bytes=p["edge_min_bytes"])
    plan = plans.choose_forward(int(x.shape[1]), x.element_size(), x.dtype == torch.bfloat16, sms, p, read)
    if plan.kernel == "rows" and sms is not None:
        plan = replace(plan, rows=launch.rows_per_program(plan, int(x.shape[0]), sms, p, read, launch.alignment(x, y)))
    if plan.kernel in ("split", "split_pairs") and sms is not None:
        plan = replace(plan, block=plans.split_chunk(plan.block, int(x.shape[0]), int(x.shape[1]), sms, p))
    return Launched(plan, read)


def score(per_shape: Sequence[dict]) -> dict[str, float]:
    """Per candidate: geometric mean over the shapes of (its plan's ms / the best ms there); a failed plan scores
    as 10x."""
    cases = []
    for case in per_shape:
        timed = [v for v in case["plans"].values() if isinstance(v, float)]
        by_candidate = {name: case["plans"].get(plan) for name, plan in case["by_candidate"].items()}
        cases.append((by_candidate, min(timed + list(case["peers"].values()))))
    return tuning.geomean_scores(CANDIDATES, cases)


def cases(shapes: Sequence[Shape], dtypes: Sequence[torch.dtype]) -> list[dict]:
    """One case per (dtype, shape), dtypes outermost: {"shape": [rows, width], "dtype": "float32"}."""
    return [{"shape": list(shape), "dtype": dtype_name(dtype)} for dtype in dtypes for shape in shapes]


def describe(case: dict) -> str:
    return f"{case['dtype']} {tuple(case['shape'])}"


def cost(case: dict) -> float:
    """Estimated seconds: the candidates' distinct plans (at most one each) and torch timed side by side, and the
    bytes they move."""
    from fuselab.bench.distributed import case_cost

    calls = len(CANDIDATES) + 1
    nbytes = 2 * math.prod(case["shape"]) * parse_dtype(case["dtype"]).itemsize
    return case_cost(impls=calls, nbytes=calls * nbytes)


def measure(
    case: dict, device: torch.device, quick: bool, compile_peer: bool, only: Sequence[str] | None = None
) -> dict:
    """`tune_shape` at one case: {"case": case, "plans", "by_candidate", "peers"} (JSON-able); `only`: those
    candidates beside the defaults (a held-out check of a choice)."""
    timing = {"warmup_ms": 10, "rep_ms": 20, "min_reps": 3} if quick else {"warmup_ms": 30, "rep_ms": 100}
    shape, dtype = tuple(case["shape"]), parse_dtype(case["dtype"])
    unknown = set(only or ()) - set(CANDIDATES)
    if unknown:
        raise ValueError(f"softmax tuner: no candidate {', '.join(sorted(unknown))}")
    return {"case": case, **tune_shape(shape, dtype, device, compile_peer, timing, only)}


def summary(measured: dict) -> str:
    best = min((v for v in measured["plans"].values() if isinstance(v, float)), default=float("nan"))
    return f"best plan {best:.4f} ms, peers {measured['peers']}"


def choose(measurements: Sequence[dict], held_out: Sequence[dict] = ()) -> tuple[dict, dict]:
    """The candidates that beat the rules as they stand (`score`), taken together where they do not meet
    (`combine`): (the rules with their overrides, evidence: scores, the winner (the chosen names joined by " + ",
    or "defaults"), chosen, the shapes and dtypes). The rules the cases were timed on (`base`: this GPU's table) stay
    where no chosen candidate overrides them. `held_out`: measurements of the chosen candidates at cases not tuned
    on (measure's `only`); a candidate that slows one of them more than SLOWER_AT_MOST is dropped (evidence
    "checked": those cases, and each candidate's worst ratio there)."""
    scores = score(measurements)
    chosen = combine(measurements, scores)
    checked = {n: slowdown(held_out, n) for n in chosen if held_out}
    chosen = [n for n in chosen if checked.get(n, (1.0,))[0] <= SLOWER_AT_MOST]
    if len(chosen) > 1:
        scores[" + ".join(chosen)] = combined_score(measurements, chosen)
    shapes = dict.fromkeys(tuple(m["case"]["shape"]) for m in measurements)
    slower = {n: slowdown(measurements, n) for n in scores if n in CANDIDATES and scores[n] < scores["defaults"]}
    evidence = {
        "scores": scores,
        "winner": " + ".join(chosen) or "defaults",
        "chosen": chosen,
        "not_taken_slower": {n: {"ratio": r, "case": c} for n, (r, c) in slower.items() if r > SLOWER_AT_MOST},
        "shapes": [list(s) for s in shapes],
        "dtypes": list(dict.fromkeys(m["case"]["dtype"] for m in measurements)),
    }
    if held_out:
        evidence["checked"] = {
            "shapes": [list(s) for s in dict.fromkeys(tuple(m["case"]["shape"]) for m in held_out)],
            "dtypes": list(dict.fromkeys(m["case"]["dtype"] for m in held_out)),
            "slowest": {n: {"ratio": r, "case": c} for n, (r, c) in checked.items()},
            "dropped": [n for n, (r, _) in checked.items() if r > SLOWER_AT_MOST],
        }
    base = measurements[0].get("base") if measurements else None
    overrides = {k: v for name in chosen for k, v in CANDIDATES[name].items()}
    return candidate_params(overrides, base), evidence


def _changed(measurements: Sequence[dict], name: str) -> set[int]:
    """The cases (indices) where candidate `name` launches something else than the defaults."""
    return {i for i, m in enumerate(measurements) if m["by_candidate"][name] != m["by_candidate"]["defaults"]}


SLOWER_AT_MOST = 1.05  # a candidate slower than the rules as they stand by more than this at any case is not taken


def slowdown(measurements: Sequence[dict], name: str) -> tuple[float, dict | None]:
    """The most candidate `name` slows a case down against the defaults (its time over theirs; a failed plan counts
    as tuning.FAILED_RATIO), and that case (None where it changes none)."""
    worst: tuple[float, dict | None] = (1.0, None)
    for i in _changed(measurements, name):
        m = measurements[i]
        ms, base = (m["plans"].get(m["by_candidate"][n]) for n in (name, "defaults"))
        ratio = ms / base if isinstance(ms, float) and isinstance(base, float) else tuning.FAILED_RATIO
        worst = max(worst, (ratio, m["case"]), key=lambda w: w[0])
    return worst


def combine(measurements: Sequence[dict], scores: dict[str, float]) -> list[str]:
    """Candidates scoring below the defaults, best first, each taken unless it makes any case more than
    SLOWER_AT_MOST slower than the defaults (a gain on some shapes never pays for a loss on others), sets a parameter
    a candidate taken before sets, or changes the launch at a case one taken before changed: each rule has its own
    regime (scalar tiles the rows read element by element, `widest_fp32` wide fp32 rows...), so one tuning run fixes
    every cliff it finds, and at every case the combination runs a launch that was timed there."""
    chosen: list[str] = []
    keys: set[str] = set()
    touched: set[int] = set()
    for name in sorted((n for n in scores if n != "defaults" and scores[n] < scores["defaults"]), key=scores.get):
        changed = _changed(measurements, name)
        if keys & set(CANDIDATES[name]) or changed & touched or slowdown(measurements, name)[0] > SLOWER_AT_MOST:
            continue
        chosen.append(name)
        keys |= set(CANDIDATES[name])
        touched |= changed
    return chosen


def combined_score(measurements: Sequence[dict], chosen: Sequence[str]) -> float:
    """The geometric mean over the cases of the combination's time over the best there: at each case the launch of
    the chosen candidate that changed it (`combine` lets at most one), else the defaults'."""
    changed = {name: _changed(measurements, name) for name in chosen}
    logs = []
    for i, m in enumerate(measurements):
        name = next((n for n in chosen if i in changed[n]), "defaults")
        ms = m["plans"].get(m["by_candidate"][name])
        timed = [v for v in m["plans"].values() if isinstance(v, float)] + list(m["peers"].values())
        logs.append(math.log(ms / min(timed) if isinstance(ms, float) else tuning.FAILED_RATIO))
    return math.exp(sum(logs) / len(logs))
