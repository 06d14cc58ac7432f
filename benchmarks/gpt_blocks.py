"""A stack of GPT blocks built twice, of torch.nn and of fuselab's drop-ins, timed forward + backward side by side.

The blocks are the gate's (fuselab.gate.model.Block): pre-norm, LayerNorm, causal multi-head attention, an MLP, here
with the tanh GELU (GPT-2's). The fuselab model is the torch.nn one with `nn.GELU(approximate="tanh")` swapped for
`fuselab.nn.GELU(approximate="tanh")` and F.scaled_dot_product_attention for
`fuselab.nn.functional.scaled_dot_product_attention`, same weights, each with its default impl. One step: the
blocks' forward on x (B, N, d_model), `out.float().square().mean().backward()`. Timed by fuselab's harness, the four
(torch.nn and fuselab, eager and under torch.compile(fullgraph=True)) taking turns, rested (L2 flushed, an idle GPU
before each step) and back to back (on CUDA).

    PYTHONPATH=src python3 benchmarks/gpt_blocks.py --out benchmarks/results/h200/gpt_blocks.json
    PYTHONPATH=src python3 benchmarks/gpt_blocks.py --device cpu --dim 64 --heads 4 --tokens 33 --batch 2 \
        --layers 2 --dtype fp32 --rep-ms 50 --no-compile

`--host` also times the host's ms a step (queued behind a sleeping kernel: an upper bound, see `host_ms`) and
profiles fuselab's compiled step in Python (cProfile): what the host does where a step is bound by it, back to back.

`--kernels PATH` also profiles each step (torch.profiler, a few steps after the timing) and writes every kernel's
calls and GPU µs a step to PATH (JSON), then prints, for eager and compiled, the kernels whose time a step differs most
between the two models: where a gap between them is.

On the CPU the drop-ins' default impls are PyTorch's own (impl="auto": Triton would only interpret there), so
both models run the same kernels: a check that the example runs, not a measurement.
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import io
import json
import pstats
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from fuselab.bench.accuracy import gradient_error
from fuselab.bench.dtypes import dtype_name, parse_dtype
from fuselab.bench.env import environment, revision
from fuselab.bench.timer import Timing, benchmark_side_by_side
from fuselab.gate.model import Block
from fuselab.profile.capture import profile_callable
from fuselab.profile.table import build_table


def torch_blocks(layers: int, dim: int, heads: int) -> nn.Sequential:
    return nn.Sequential(*(Block(dim, heads, nn.GELU(approximate="tanh"), F.scaled_dot_product_attention)
                           for _ in range(layers)))  # fmt: skip


def fuselab_blocks(like: nn.Sequential) -> nn.Sequential:
    """`like` with its GELUs and attention swapped for fuselab's drop-ins (weights copied)."""
    import fuselab.nn

    model = copy.deepcopy(like)
    for block in model:
        block.act = fuselab.nn.GELU(approximate="tanh")
        block.attend = fuselab.nn.functional.scaled_dot_product_attention
    return model


def step(model: nn.Module, x: torch.Tensor) -> Callable[[], list[torch.Tensor]]:
    """One forward + backward: the gradients of every parameter and of x (not accumulated)."""
    params = [*model.parameters(), x]
    return lambda: torch.autograd.grad(model(x).float().square().mean(), params)


def step_kernels(call: Callable[[], object], label: str, steps: int = 5) -> dict[str, tuple[float, float]]:
    """{kernel name: (launches a step, GPU µs a step)} of `steps` profiled calls of `call`, after two unprofiled."""
    with tempfile.TemporaryDirectory() as folder:
        result = profile_callable(call, label=label, warmup=2, iters=steps, out_dir=folder)
    kernels: dict[str, tuple[float, float]] = {}
    for op in build_table(result.trace).ops:
        for k in op.kernels:
            calls, us = kernels.get(k.name, (0.0, 0.0))
            kernels[k.name] = (calls + k.calls / steps, us + k.gpu_us / steps)
    return kernels


def host_ms(call: Callable[[], object], steps: int = 9) -> float:
    """The host's median ms to queue one step behind a sleeping kernel: an upper bound (launches may still wait for
    room in the GPU's queue), to compare between models."""
    call()
    samples = []
    for _ in range(steps):
        torch.cuda.synchronize()
        torch.cuda._sleep(100_000_000)  # some 50 ms of GPU cycles: longer than any step's launches
        start = time.perf_counter()
        call()
        samples.append((time.perf_counter() - start) * 1e3)
    torch.cuda.synchronize()
    return statistics.median(samples)


def host_profile(call: Callable[[], object], steps: int = 5, top: int = 30) -> str:
    """cProfile's `top` functions by own time over `steps` calls of `call`, the GPU kept busy ahead of them."""
    call()
    torch.cuda.synchronize()
    torch.cuda._sleep(400_000_000)
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(steps):
        call()
    profile.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(top)
    return text.getvalue()


def kernel_gaps(kernels: dict[str, dict[str, tuple[float, float]]], mode: str, top: int = 12) -> list[str]:
    """Lines: the `top` kernels whose GPU µs a step differ most between fuselab's and torch.nn's `mode` step."""
    ours, theirs = kernels[f"fuselab {mode}"], kernels[f"torch.nn {mode}"]
    names = sorted(ours.keys() | theirs.keys(), key=lambda n: -abs(ours.get(n, (0, 0))[1] - theirs.get(n, (0, 0))[1]))
    total = [sum(us for _, us in k.values()) for k in (ours, theirs)]
    lines = [f"{mode}: GPU µs a step, fuselab {total[0]:.1f}, torch.nn {total[1]:.1f}; the largest differences:"]
    for n in names[:top]:
        (c0, u0), (c1, u1) = ours.get(n, (0, 0)), theirs.get(n, (0, 0))
        lines.append(f"  {u0 - u1:+9.1f}  fuselab {u0:8.1f} ({c0:g} calls)  torch.nn {u1:8.1f} ({c1:g})  {n[:90]}")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, help="results JSON")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="bf16", help="bf16, fp16 or fp32 (default bf16)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--dim", type=int, default=768, help="d_model (default 768)")
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--rep-ms", type=float, default=1000.0, help="each step's timed repetitions, ms (rested)")
    p.add_argument("--no-compile", action="store_true", help="eager only (torch.compile takes minutes on a CPU)")
    p.add_argument("--host", action="store_true", help="time the host's ms a step, profile fuselab's compiled one")
    p.add_argument("--kernels", type=Path, help="profile each step too: its kernels' GPU µs a step, JSON")
    args = p.parse_args(argv)
    if args.dim % args.heads:
        p.error(f"--dim {args.dim} is not a multiple of --heads {args.heads}")
    dtype = parse_dtype(args.dtype)
    torch.manual_seed(0)
    base = torch_blocks(args.layers, args.dim, args.heads).to(args.device, dtype)
    models = {"torch.nn": base, "fuselab": fuselab_blocks(base)}
    gen = torch.Generator(device=args.device).manual_seed(1)
    x = torch.randn(args.batch, args.tokens, args.dim, generator=gen, device=args.device).to(dtype)
    x.requires_grad_(True)
    calls = {f"{name} eager": step(model, x) for name, model in models.items()}
    if not args.no_compile:
        calls |= {f"{name} compiled": step(torch.compile(model, fullgraph=True), x) for name, model in models.items()}
    grads = {name: call() for name, call in calls.items()}  # the first call compiles; the models must agree
    reference = grads["torch.nn eager"]
    agree = {name: gradient_error(g, reference) for name, g in grads.items()}
    timing = Timing(warmup_ms=min(300.0, args.rep_ms), rep_ms=args.rep_ms, min_reps=5)
    rested = benchmark_side_by_side(calls, rounds=5, device=args.device, timing=timing)
    sustained = {}
    if args.device.startswith("cuda"):
        from fuselab.evaluate import back_to_back

        sustained = back_to_back(calls, device=args.device, timing=timing, rounds=5)
    host = {name: host_ms(call) for name, call in calls.items()} if args.host and args.device.startswith("cuda") else {}
    rows = []
    for name in calls:
        base_name = "torch.nn " + name.split()[-1]
        row = {"step": name, "median_ms": rested[name].median_ms, "iqr_ms": rested[name].iqr_ms, "runs": rested[name].n,
               "time_vs_torch_nn": rested[name].median_ms / rested[base_name].median_ms,
               "grad_rel_err_vs_torch_nn_eager": agree[name]}  # fmt: skip
        if sustained:
            row |= {"sustained_ms": sustained[name], "sustained_vs_torch_nn": sustained[name] / sustained[base_name]}
        if host:
            row |= {"host_ms": host[name]}
        rows.append(row)
    head = ("step", "rested ms", "IQR", "vs torch.nn", "sustained", "host ms", "grad err")
    print(" ".join(f"{h:{w}}" for h, w in zip(head, ("18", ">10", ">7", ">11", ">10", ">8", ">9"), strict=True)))
    for r in rows:
        print(f"{r['step']:18} {r['median_ms']:10.3f} {r['iqr_ms']:7.3f} {r['time_vs_torch_nn']:11.3f} "
              f"{r.get('sustained_ms', float('nan')):10.3f} {r.get('host_ms', float('nan')):8.3f} "
              f"{r['grad_rel_err_vs_torch_nn_eager']:9.2g}")  # fmt: skip
    if host and "fuselab compiled" in calls:
        print("fuselab compiled, the host's own time by function (cProfile):")
        print(host_profile(calls["fuselab compiled"]))
    commit, dirty = revision()
    shape = {name: getattr(args, name) for name in ("layers", "dim", "heads", "batch", "tokens")}
    about = {"model": shape, "dtype": dtype_name(dtype), "revision": commit, "dirty": dirty,
             "env": environment(args.device)}  # fmt: skip
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(about | {"rows": rows}, indent=1) + "\n")
    if args.kernels:
        kernels = {name: step_kernels(call, name) for name, call in calls.items()}
        for mode in ("eager", "compiled"):
            if f"fuselab {mode}" in kernels:
                print("\n".join(kernel_gaps(kernels, mode)))
        args.kernels.parent.mkdir(parents=True, exist_ok=True)
        table = {name: [{"kernel": n, "calls_per_step": c, "gpu_us_per_step": us} for n, (c, us) in k.items()]
                 for name, k in kernels.items()}  # fmt: skip
        args.kernels.write_text(json.dumps(about | {"steps": table}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
