"""Time the attention Triton kernels' plan candidates on this GPU and store the fastest as data.

    python -m fuselab.ops.attention.tune                          # bf16 and fp16, d 64 and 128, causal and not
    python -m fuselab.ops.attention.tune --dtype bf16 --d 64 --d 96 --out plans.json

For each (dtype, head dim, causal) it times, on a tuning shape that is not one of the benchmark's (N = 3000, batch and
heads making ~16k tokens of hidden 2048), the forward's candidates, then the backward with each dK/dV candidate (dQ at
its rule), then each dQ candidate (dK/dV at the best found). Each candidate is checked against the tiled reference
first; a candidate that fails to compile (shared memory) or is wrong is dropped. Timing: triton.testing.do_bench
(back to back, L2 flushed). The winners go to plans/<gpu>.json, which the launchers read (falling back to the rule
for keys absent there).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import asdict

import torch
import triton

from fuselab.ops.attention import triton_kernels as tk
from fuselab.ops.attention.spec import reference
from fuselab.ops.evaluate import parse_dtype, relative_error

Plan = tk.Plan
KERNELS = tk.KERNELS


def candidates(kernel: str, d: int, dtype: torch.dtype) -> list[Plan]:
    """The rule's plan first, then alternatives around it (tile shapes, warps, stages), without repeats."""
    row = tk.d_pad(d) * dtype.itemsize
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


def tune_case(
    d: int, dtype: torch.dtype, causal: bool, n: int = 3000, log: Callable[[str], None] = print, warm: bool = False
) -> dict:
    """Best plans for one (d, dtype, causal) with their times; every candidate's time or error in 'trials'.
    warm: only compile and check every candidate (to fill Triton's cache from parallel processes), time nothing."""
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
            if warm:
                plans = {name: plan for name in KERNELS if plan in candidates(name, d, dtype)}
            try:
                check(plans)
                if warm:
                    continue
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", action="append", help="bf16, fp16, fp32 (repeatable; default bf16 and fp16)")
    parser.add_argument("--d", action="append", type=int, help="head dims (repeatable; default 64 and 128)")
    parser.add_argument("--causal", choices=("both", "yes", "no"), default="both")
    parser.add_argument("--n", type=int, default=3000, help="sequence length of the tuning shape")
    parser.add_argument("--out", help="also write the trials here (JSON)")
    parser.add_argument("--warm", action="store_true", help="compile and check the candidates only; write nothing")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("tune needs a CUDA GPU")
    dtypes = [parse_dtype(x) for x in args.dtype or ["bf16", "fp16"]]
    causals = {"both": (False, True), "yes": (True,), "no": (False,)}[args.causal]
    device = torch.device("cuda", torch.cuda.current_device())
    slug = tk.gpu_slug(device)
    plans = dict(tk.plan_table(slug))
    report = []
    meta = {"gpu": torch.cuda.get_device_name(device), "torch": torch.__version__, "triton": triton.__version__}
    for dtype in dtypes:
        for d in args.d or [64, 128]:
            for causal in causals:
                print(f"{slug} {dtype} d={d} causal={causal}", flush=True)
                result = tune_case(d, dtype, causal, args.n, warm=args.warm)
                if args.warm:
                    continue
                for kernel, plan in result["best"].items():
                    plans[tk.plan_key(kernel, d, dtype, causal)] = plan
                report.append({"dtype": str(dtype), "d": d, "causal": causal, **result})
                path = tk.save_plans(slug, plans, meta)  # after every case: an interrupted run keeps what it found
                print(f"wrote {path}", flush=True)
                if args.out:
                    body = [{**r, "best": {k: asdict(p) for k, p in r["best"].items()}} for r in report]
                    with open(args.out, "w") as f:
                        json.dump({"meta": meta, "cases": body}, f, indent=1)


if __name__ == "__main__":
    main()
