"""Attention on the GPU: correctness at odd shapes, then fwd and fwd+bwd times of triton against SDPA's backends.

    python benchmarks/attention_gpu.py --out $OUT/attention.json                 # leaderboard step + papers' grid
    python benchmarks/attention_gpu.py --only leaderboard --impls triton,sdpa-cudnn

Cases: CS336's leaderboard step, q/k/v (16, 16384, 64) causal bf16, forward + o.sum().backward(); the FlashAttention
papers' grid, 16k tokens, hidden 2048 (batch 16384/N, heads 2048/d), N 512..16384, d 64 and 128, causal and not.
Each case is timed two ways: sustained (triton.testing.do_bench, back to back as the papers time) and rested
(fuselab.bench.benchmark: warm-up, L2 flush, CUDA events, median). FLOPs by the papers' convention (spec.flops):
forward 4*B*H*N^2*d, halved when causal; forward + backward 3.5x that. Printed: ms, TFLOP/s, ratio to SDPA-flash and
cuDNN; the rows go to --out as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
import triton

from fuselab.bench.dtypes import parse_dtype
from fuselab.bench.env import environment
from fuselab.bench.timer import benchmark
from fuselab.ops.attention import ATTENTION, attention
from fuselab.ops.attention.spec import PAPER_GRID, flops, reference
from fuselab.ops.evaluate import relative_error

CHECK_SHAPES = [(2, 3, 1, 1, 64), (1, 4, 2, 333, 257, 80), (2, 6, 1000, 96), (1, 2, 777, 128), (3, 555, 64)]


def check(log: list, dtypes: list[torch.dtype]) -> bool:
    """Triton against the float64 reference (output and gradients) at odd shapes, causal and not."""
    ok = True
    for dtype in dtypes:
        for shape in CHECK_SHAPES:
            for causal in (False, True):
                q, k, v = ATTENTION.make_inputs(shape, dtype, "cuda", 1)
                xs = [t.clone().requires_grad_(True) for t in (q, k, v)]
                out = attention(*xs, causal=causal, impl="triton")
                dout = torch.randn_like(out)
                out.backward(dout)
                xs64 = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
                ref = reference(*xs64, causal=causal)
                ref.backward(dout.double())
                errs = [relative_error(out, ref)] + [
                    relative_error(a.grad, b.grad) for a, b in zip(xs, xs64, strict=True)
                ]
                tol = ATTENTION.tolerance[dtype]
                good = max(errs) < tol
                ok &= good
                row = {"check": list(shape), "dtype": str(dtype), "causal": causal, "errs": errs, "pass": good}
                log.append(row)
                print(f"check {dtype!s:15} {shape!s:24} causal={causal!s:5} max err {max(errs):.2e} "
                      f"tol {tol:.0e} {'pass' if good else 'FAIL'}", flush=True)  # fmt: skip
    return ok


def make_call(impl: str, shape: tuple, causal: bool, backward: bool, leaderboard: bool):
    q, k, v = ATTENTION.make_inputs(shape, torch.bfloat16, "cuda", 0)
    if backward:
        q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    do = torch.randn_like(q)

    def fwd() -> None:
        attention(q, k, v, causal=causal, impl=impl)

    def fwd_bwd() -> None:
        o = attention(q, k, v, causal=causal, impl=impl)
        if leaderboard:
            o.sum().backward()
        else:
            o.backward(do)

    return fwd_bwd if backward else fwd


def time_case(impl: str, shape: tuple, causal: bool, backward: bool, leaderboard: bool) -> dict:
    try:
        call = make_call(impl, shape, causal, backward, leaderboard)
        call()
        torch.cuda.synchronize()
        sustained = triton.testing.do_bench(call, warmup=20, rep=80)
        rested = benchmark(call, label=impl, warmup_ms=40, rep_ms=100, min_reps=5).median_ms
    except Exception as exc:  # unavailable backend, out of memory: a row with its error
        torch.cuda.empty_cache()
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}
    work = flops(shape, causal=causal, backward=backward)
    return {
        "sustained_ms": sustained,
        "rested_ms": rested,
        "sustained_tflops": work / sustained / 1e9,
        "rested_tflops": work / rested / 1e9,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="JSON results file")
    parser.add_argument("--impls", default="triton,sdpa-flash,sdpa-cudnn")
    parser.add_argument("--only", choices=("all", "leaderboard", "grid"), default="all")
    parser.add_argument("--no-check", action="store_true")
    parser.add_argument("--check-dtypes", default="bf16,fp16,fp32")
    parser.add_argument("--naive-max-n", type=int, default=4096, help="time naive up to this N (its N x N scores)")
    args = parser.parse_args()
    impls = args.impls.split(",")
    log: list = []
    env = environment("cuda")
    result: dict = {"env": env, "checks": log, "rows": []}
    if not args.no_check:
        result["checks_pass"] = check(log, [parse_dtype(x) for x in args.check_dtypes.split(",")])
    cases = []
    if args.only in ("all", "leaderboard"):
        cases.append(("leaderboard", (16, 16384, 64), True, (True,)))
    if args.only in ("all", "grid"):
        cases += [("grid", shape, causal, (False, True)) for shape in PAPER_GRID for causal in (False, True)]
    for name, shape, causal, modes in cases:
        for backward in modes:
            row: dict = {"case": name, "shape": list(shape), "causal": causal, "backward": backward, "impls": {}}
            names = list(impls)
            if "naive" not in names and shape[-2] <= args.naive_max_n and name == "grid":
                names.append("naive")
            for impl in names:
                row["impls"][impl] = time_case(impl, shape, causal, backward, name == "leaderboard")
            r = row["impls"]
            for base in ("sdpa-flash", "sdpa-cudnn"):
                for how in ("sustained", "rested"):
                    t, b = r.get("triton", {}).get(f"{how}_ms"), r.get(base, {}).get(f"{how}_ms")
                    row[f"{how}_speedup_vs_{base}"] = b / t if t and b else None
            result["rows"].append(row)
            line = "  ".join(
                f"{impl} {x['sustained_ms']:.3f}ms {x['sustained_tflops']:.0f}TF/{x['rested_tflops']:.0f}TF"
                if "error" not in x
                else f"{impl} ERR"
                for impl, x in r.items()
            )
            ratios = " ".join(
                f"x{base.removeprefix('sdpa-')} {row[f'sustained_speedup_vs_{base}'] or 0:.2f}"
                f"/{row[f'rested_speedup_vs_{base}'] or 0:.2f}"
                for base in ("sdpa-flash", "sdpa-cudnn")
            )
            mode = "fwd+bwd" if backward else "fwd"
            print(f"{name} {shape} causal={causal} {mode}: {line} | {ratios}", flush=True)
            if args.out:
                with open(args.out, "w") as f:
                    json.dump(result, f, indent=1)
    result["finished"] = time.time()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    if not result.get("checks_pass", True):
        sys.exit(1)


if __name__ == "__main__":
    main()
