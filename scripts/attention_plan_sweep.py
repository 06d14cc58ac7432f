"""Time one attention kernel's candidate plans at chosen shapes, forward + backward, beside cuDNN, in one run.

    python3 scripts/attention_plan_sweep.py --kernel dkdv --plans 32x64x4x1,32x16x4x1 \
        --shape 24x16x4x117x117x256 --shape 2x8x8x2000x2000x192 --causal both --out sweep.jsonl

A shape is B x Hq x Hkv x Nq x Nk x d (GQA when Hkv < Hq). For each shape and causal setting, side by side
(fuselab.bench.timer.benchmark_side_by_side, L2 flushed): cuDNN (the op's sdpa-cudnn impl, K/V heads repeated once
beforehand), the Triton kernels at their own plans ("plan", what `choose_plan` picks: table or rule, fitted), and
the Triton kernels with `--kernel` forced to each of `--plans` (as given, not fitted to the shape). Each line of
`--out` (JSON) is one shape's medians in ms, with the GPU, torch, Triton and git revision. A plan that fails to
compile or gives a wrong result is recorded with its error. Exploration: what it finds goes into the rule or the
tuner's candidates (docs/ops/attention.md).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
import triton

from fuselab.bench.accuracy import relative_error
from fuselab.bench.timer import benchmark_side_by_side
from fuselab.ops.attention import triton_kernels as tk
from fuselab.ops.attention.spec import ATTENTION, reference, repeat_kv

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU: a smoke test under TRITON_INTERPRET=1


DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float32  # the interpreter: fp32 only


def parse_plan(text: str) -> tk.Plan:
    """'32x16x4x1' -> Plan(block_m 32, block_n 16, warps 4, stages 1)."""
    m, n, w, s = (int(x) for x in text.split("x"))
    return tk.Plan(m, n, w, s)


def parse_shape(text: str) -> tuple[int, ...]:
    shape = tuple(int(x) for x in text.lower().split("x"))
    if len(shape) != 6:
        raise argparse.ArgumentTypeError(f"a shape is BxHqxHkvxNqxNkxd, got {text!r}")
    return shape


def revision() -> str:
    rev = os.environ.get("FUSELAB_REVISION")
    if rev:
        return rev
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "unknown"


def sweep_shape(shape: tuple[int, ...], causal: bool, kernel: str, plans: list[tk.Plan], rep_ms: float) -> dict:
    """Medians (ms) of cuDNN, the Triton kernels at their own plans, and at each forced plan, at one shape."""
    b, hq, hkv, nq, nk, d = shape
    gen = torch.Generator(device=DEVICE).manual_seed(sum(shape) + causal)
    q, k, v, do = (
        torch.randn(b, h, n, d, device=DEVICE, generator=gen).to(DTYPE)
        for h, n in ((hq, nq), (hkv, nk), (hkv, nk), (hq, nq))
    )
    scale = d**-0.5
    # K/V heads repeated once, outside the timed call; the backend forced as `fuselab bench attention` forces it
    leaves = [t.clone().requires_grad_(True) for t in (q, *repeat_kv(q, k, v))]
    sdpa_cudnn = ATTENTION.get_impl("sdpa-cudnn")

    def cudnn() -> None:
        sdpa_cudnn(*leaves, causal=causal, scale=scale).backward(do)

    def triton_step(forced: dict[str, tk.Plan]):
        def step() -> None:
            with tk.forced_plans(forced):
                o, lse = tk.forward(q, k, v, causal, scale)
                tk.backward(do, q, k, v, o, lse, causal, scale)

        return step

    # checked against float64 on one batch entry, every output
    small = [t[:1] for t in (q, k, v)]
    refs = None
    fns = {"sdpa-cudnn": cudnn, "plan": triton_step({})}
    errors: dict[str, str] = {}
    for plan in plans:
        name = f"{plan.block_m}x{plan.block_n}x{plan.warps}x{plan.stages}"
        try:
            with tk.forced_plans({kernel: plan}):
                xs = [t.clone().double().requires_grad_(True) for t in small]
                if refs is None:
                    out = reference(*xs, causal=causal)
                    out.backward(do[:1].double())
                    refs = [out.detach(), *(x.grad for x in xs)]
                o, lse = tk.forward(*small, causal, scale)
                grads = tk.backward(do[:1], *small, o, lse, causal, scale)
                err = max(relative_error(got, want) for got, want in zip((o, *grads), refs, strict=True))
            if not err < 3e-2:
                raise AssertionError(f"relative error {err:.2e}")
            fns[name] = triton_step({kernel: plan})
        except Exception as exc:  # out of shared memory, a compile error, a wrong result
            errors[name] = f"{type(exc).__name__}: {exc}"[:200]
    try:
        measured = benchmark_side_by_side(fns, rounds=3, rep_ms=rep_ms, warmup_ms=50)
        ms = {name: m.median_ms for name, m in measured.items()}
    except Exception as exc:  # cuDNN refusing a shape: time the rest
        errors["run"] = f"{type(exc).__name__}: {exc}"[:200]
        fns.pop("sdpa-cudnn")
        ms = {name: m.median_ms for name, m in benchmark_side_by_side(fns, rounds=3, rep_ms=rep_ms).items()}
    chosen = tk.choose_plan(kernel, d, q.dtype, causal, q.device, nq, tk.seen_keys(nq, nk, causal), b * hkv)
    return {
        "shape": list(shape),
        "causal": causal,
        "kernel": kernel,
        "own_plan": str(chosen),
        "ms": ms,
        "errors": errors,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kernel", choices=tk.KERNELS, required=True)
    p.add_argument("--plans", required=True, help="comma-separated MxNxWARPSxSTAGES")
    p.add_argument("--shape", type=parse_shape, action="append", required=True)
    p.add_argument("--causal", choices=("yes", "no", "both"), default="yes")
    p.add_argument("--rep-ms", type=float, default=150.0)
    p.add_argument("--out", type=Path, required=True, help="JSON lines, appended")
    args = p.parse_args()
    if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        print("attention_plan_sweep: needs a CUDA GPU (or TRITON_INTERPRET=1, a smoke test)", file=sys.stderr)
        return 2
    plans = [parse_plan(t) for t in args.plans.split(",")]
    causals = {"yes": [True], "no": [False], "both": [False, True]}[args.causal]
    env = {
        "gpu": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "revision": revision(),
    }
    for shape in args.shape:
        for causal in causals:
            start = time.perf_counter()
            row = {**sweep_shape(shape, causal, args.kernel, plans, args.rep_ms), **env}
            with args.out.open("a") as f:
                f.write(json.dumps(row) + "\n")
            best = min(row["ms"].items(), key=lambda kv: kv[1] if kv[0] != "sdpa-cudnn" else float("inf"))
            cudnn = row["ms"].get("sdpa-cudnn")
            ratio = f"{best[1] / cudnn:.2f}x cuDNN" if cudnn else "no cuDNN"
            print(
                f"{'x'.join(map(str, shape))} causal={causal}: own {row['own_plan']} {row['ms']['plan']:.3f} ms; "
                f"best {best[0]} {best[1]:.3f} ({ratio}); {time.perf_counter() - start:.0f} s",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
