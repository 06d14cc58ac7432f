"""A transformer's feed-forward block built of torch.nn and of fuselab's GELU, timed per call as a model calls it.

Linear(d, 4d), GELU (tanh), Linear(4d, d): with `nn.GELU(approximate="tanh")` ("torch") and with
`fuselab.nn.GELU(approximate="tanh", impl=...)` for "auto" (the default a user gets: the Triton kernel eager; under
torch.compile the op's `traced_impl`, F.gelu, which Inductor fuses) and each fused impl named (triton,
cuda), same weights. Each is called eager and under torch.compile in each mode given (one compile per token count),
forward alone (no grad) and forward + backward (the gradients of every weight and of x), and timed back to back by
`fuselab.bench.timer.call_cost`: host µs per call and end-to-end µs per call (host and GPU overlapped, as in a model),
the median of `--rounds` rounds that take the impls in turn. Ratios are each impl's end-to-end time over torch's at
the same mode, pass and token count, measured side by side in one process: the median over rounds of each round's
ratio (the impls of a round run within milliseconds of each other, so the host's drift between rounds cancels), with
its quartiles.

    PYTHONPATH=src python3 benchmarks/mlp_calls.py --out benchmarks/results/h200/mlp_calls.json
    PYTHONPATH=src python3 benchmarks/mlp_calls.py --device cpu --dim 64 --tokens 3 --modes eager --impl torch

On the CPU fuselab's GELU with impl "triton" runs under Triton's interpreter only (TRITON_INTERPRET=1): a check that
the script runs, not a measurement.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from fuselab.bench.dtypes import dtype_name, parse_dtype
from fuselab.bench.env import environment, revision
from fuselab.bench.timer import call_cost


def mlp(dim: int, act: nn.Module) -> nn.Sequential:
    return nn.Sequential(nn.Linear(dim, 4 * dim), act, nn.Linear(4 * dim, dim))


def with_act(like: nn.Sequential, impl: str) -> nn.Sequential:
    """`like` (weights copied) with its GELU replaced by fuselab's, impl `impl`; `like` itself for "torch"."""
    if impl == "torch":
        return like
    import fuselab.nn

    model = copy.deepcopy(like)
    model[1] = fuselab.nn.GELU(approximate="tanh", impl=impl)
    return model


def call(model: nn.Module, x: torch.Tensor, backward: bool) -> Callable[[], object]:
    if not backward:

        def forward() -> torch.Tensor:
            with torch.no_grad():
                return model(x)

        return forward
    params = [*model.parameters(), x]
    return lambda: torch.autograd.grad(model(x).float().square().mean(), params)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, help="results JSON")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--dim", type=int, default=1024, help="d_model (default 1024; the hidden layer is 4x)")
    p.add_argument("--tokens", default="1,997,4099", help="token counts (rows of x), comma separated")
    p.add_argument("--impl", default="torch,auto,triton,cuda", help="GELUs: torch (nn.GELU) first, then fuselab's")
    p.add_argument("--modes", default="eager,default,max-autotune-no-cudagraphs", help="eager and compile modes")
    p.add_argument("--budget-ms", type=float, default=100.0, help="call_cost's time per case and impl")
    p.add_argument("--rounds", type=int, default=15, help="interleaved rounds per case (medians are reported)")
    args = p.parse_args(argv)
    impls, modes = args.impl.split(","), args.modes.split(",")
    if impls[0] != "torch":
        p.error("--impl must start with torch (the baseline of every ratio)")
    dtype = parse_dtype(args.dtype)
    torch.manual_seed(0)
    base = mlp(args.dim, nn.GELU(approximate="tanh")).to(args.device, dtype)
    rows, start = [], time.perf_counter()
    for tokens in (int(t) for t in args.tokens.split(",")):
        x = torch.randn(tokens, args.dim, device=args.device, dtype=dtype, requires_grad=True)
        for mode in modes:
            torch._dynamo.reset()  # each impl's model compiled afresh in this mode, all held at once below
            models = {impl: with_act(base, impl) for impl in impls}
            if mode != "eager":
                models = {impl: torch.compile(model, mode=mode) for impl, model in models.items()}
            for backward in (False, True):
                fns = {impl: call(model, x, backward) for impl, model in models.items()}
                for fn in fns.values():
                    fn()  # compiles
                costs = {impl: [] for impl in impls}
                for r in range(args.rounds):  # interleaved, each round in another order: drift hits every impl alike
                    for impl in impls[r % len(impls) :] + impls[: r % len(impls)]:
                        costs[impl].append(
                            call_cost(fns[impl], device=args.device, budget_ms=args.budget_ms / args.rounds)
                        )
                pass_name = "forward + backward" if backward else "forward"
                host = {impl: statistics.median(c.host_us for c in cs) for impl, cs in costs.items()}
                e2e = {impl: statistics.median(c.end_to_end_us for c in cs) for impl, cs in costs.items()}
                for impl in impls:
                    # each round's ratio to torch's in the same round: the host's drift between rounds cancels
                    paired = [
                        c.end_to_end_us / t.end_to_end_us for c, t in zip(costs[impl], costs["torch"], strict=True)
                    ]
                    quartiles = statistics.quantiles(paired, n=4) if len(paired) > 1 else [paired[0]] * 3
                    row = {"tokens": tokens, "mode": mode, "pass": pass_name, "impl": impl, "rounds": args.rounds,
                           "host_us": host[impl], "e2e_us": e2e[impl], "e2e_vs_torch": statistics.median(paired),
                           "e2e_vs_torch_iqr": [quartiles[0], quartiles[2]]}  # fmt: skip
                    rows.append(row)
                    print(f"{tokens:6d} {mode:27} {pass_name:18} {impl:7} host {host[impl]:8.1f} us  "
                          f"e2e {e2e[impl]:8.1f} us  {row['e2e_vs_torch']:.3f}x "
                          f"[{quartiles[0]:.3f}, {quartiles[2]:.3f}]  ({time.perf_counter() - start:.0f} s)",
                          flush=True)  # fmt: skip
    torch._dynamo.reset()
    if args.out:
        commit, dirty = revision()
        record = {"model": {"dim": args.dim, "hidden": 4 * args.dim}, "dtype": dtype_name(dtype), "revision": commit,
                  "dirty": dirty, "env": environment(args.device), "budget_ms": args.budget_ms,
                  "rows": rows}  # fmt: skip
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
