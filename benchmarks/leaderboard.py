"""CS336's leaderboard step, timed as the leaderboard times it, beside PyTorch's fastest attention, in one run.

The step: q, k, v of (16, 16384, 64) in bf16, causal; `f = torch.compile(FlashAttentionTriton.apply)`,
`o = f(q, k, v, True)`, `o.sum().backward()`. Beside it: the same class in eager mode and F.scaled_dot_product_attention
forced to cuDNN and to FlashAttention(-2), each doing the same forward + backward on the same inputs. Timed by
fuselab's harness taking turns (rested: an idle, L2-flushed GPU before each call) and back to back (calls queued, no
flush: the sustained figure for a power-bound kernel).

    PYTHONPATH=src python3 benchmarks/leaderboard.py --out benchmarks/results/h200/leaderboard.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from fuselab.bench.accuracy import relative_error
from fuselab.bench.env import environment, revision
from fuselab.bench.timer import Timing, benchmark_side_by_side
from fuselab.evaluate import back_to_back
from fuselab.ops.attention import FlashAttentionTriton
from fuselab.ops.attention.spec import flops

SHAPE = (16, 16384, 64)


def steps(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> dict[str, object]:
    """{name: a callable doing one forward + o.sum() backward}, the gradients not accumulated."""
    compiled = torch.compile(FlashAttentionTriton.apply)

    def fuselab_step(f):
        return lambda: torch.autograd.grad(f(q, k, v, True).sum(), (q, k, v))

    def sdpa_step(backend: SDPBackend):
        q4, k4, v4 = (t.unsqueeze(1) for t in (q, k, v))  # (B, 1, N, d): SDPA's 4-D layout, same storage

        def step():
            with sdpa_kernel(backend):
                return torch.autograd.grad(F.scaled_dot_product_attention(q4, k4, v4, is_causal=True).sum(), (q, k, v))

        return step

    return {
        "fuselab compiled (the leaderboard step)": fuselab_step(compiled),
        "fuselab eager": fuselab_step(FlashAttentionTriton.apply),
        "sdpa-cudnn": sdpa_step(SDPBackend.CUDNN_ATTENTION),
        "sdpa-flash": sdpa_step(SDPBackend.FLASH_ATTENTION),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--rep-ms", type=float, default=1500.0, help="each step's timed repetitions, ms (rested)")
    args = p.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(SHAPE, generator=gen, device="cuda").bfloat16().requires_grad_(True) for _ in range(3))
    calls = steps(q, k, v)
    grads = {name: call() for name, call in calls.items()}  # first call: compiles; and the steps must agree
    reference = grads["sdpa-cudnn"]
    agree = {n: max(relative_error(a, b) for a, b in zip(g, reference, strict=True)) for n, g in grads.items()}
    timing = Timing(warmup_ms=300.0, rep_ms=args.rep_ms, min_reps=10)
    rested = benchmark_side_by_side(calls, rounds=5, timing=timing)
    sustained = back_to_back(calls, device="cuda", timing=timing, rounds=5)
    step_flops = flops((SHAPE[0], 1, SHAPE[1], SHAPE[2]), causal=True, backward=True)
    rows = []
    for name in calls:
        m = rested[name]
        rows.append({
            "step": name, "median_ms": m.median_ms, "iqr_ms": m.iqr_ms, "runs": m.n,
            "sustained_ms": sustained[name], "tflops": step_flops / (m.median_ms * 1e-3) / 1e12,
            "sustained_tflops": step_flops / (sustained[name] * 1e-3) / 1e12,
            "grad_rel_err_vs_cudnn": agree[name],
        })  # fmt: skip
    base = {r["step"]: r for r in rows}["sdpa-cudnn"]
    for r in rows:
        r["time_vs_cudnn"] = r["median_ms"] / base["median_ms"]
        r["sustained_vs_cudnn"] = r["sustained_ms"] / base["sustained_ms"]
    commit, dirty = revision()
    record = {"shape": SHAPE, "dtype": "bfloat16", "causal": True, "revision": commit, "dirty": dirty,
              "env": environment("cuda"), "flops_per_step": step_flops, "rows": rows}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"{'step':42} {'rested ms':>10} {'IQR':>7} {'sustained':>10} {'vs cuDNN':>9} {'grad err':>9}")
    for r in rows:
        print(f"{r['step']:42} {r['median_ms']:10.3f} {r['iqr_ms']:7.3f} {r['sustained_ms']:10.3f} "
              f"{r['time_vs_cudnn']:9.3f} {r['grad_rel_err_vs_cudnn']:9.2g}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
