"""The cost of a call: host us/call and end-to-end us/call of back-to-back calls, per impl (issue 18).

Subcommands (each writes JSON; `merge` adds the picture):
  eager   host cost of one call of each fused impl beside its PyTorch built-in and a bare Triton launch, forward and
          forward + backward, at the issue's small sizes. Run once with the package before a change on PYTHONPATH
          (`--label before --harness NEW/src/fuselab/bench/timer.py`, since the old harness has no call_cost) and once
          after (`--label after`): the two runs are the before/after table.
  study   the launch-bound picture: end-to-end us/call against size for each impl, eager and under torch.compile
          (mode "max-autotune-no-cudagraphs" and "reduce-overhead"), the size from which each is GPU-bound; and the
          small MLP (Linear, GELU, Linear in bf16) at batch 1 and 4096 with F.gelu or fuselab's GELU.
  merge   joins eager before/after and the study into one JSON (benchmarks/results/h200/call_cost.json) and plots it.

Usage (on the GPU): PYTHONPATH=src python benchmarks/call_cost.py eager --label after --out after.json
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

GELU_N = 4096  # the sizes
SOFTMAX_SHAPE = (64, 1000)
FUSED = ("triton", "cuda")


def harness(path: str | None) -> Callable[..., object]:
    """fuselab.bench.timer.call_cost, or the one in the timer.py at `path` (for a package that predates it)."""
    if path is None:
        from fuselab.bench.timer import call_cost

        return call_cost
    spec = importlib.util.spec_from_file_location("call_cost_timer", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module.call_cost


def environment() -> dict[str, object]:
    import triton

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return {"torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version(), "gpu": gpu,
            "cpu": platform.processor() or platform.machine()}  # fmt: skip


# ---------------------------------------------------------------------------------------------- eager


def bare_triton_launch(n: int, device: str) -> Callable[[], object]:
    """A trivial Triton kernel (y = x) launched straight from its JITFunction, with its output allocated: the floor
    a Triton impl's eager call is held to."""
    import triton
    import triton.language as tl

    @triton.jit
    def copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)

    x = torch.randn(n, device=device)

    def call() -> torch.Tensor:
        y = torch.empty_like(x)
        copy_kernel[(triton.cdiv(n, 1024),)](x, y, n, BLOCK=1024)
        return y

    return call


def forward_backward(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> Callable[[], object]:
    """One forward and its backward (torch.autograd.grad: no accumulation into x.grad)."""
    x = x.detach().requires_grad_(True)
    dy = torch.randn_like(x)
    return lambda: torch.autograd.grad(fn(x), x, dy)


def eager_cases(device: str, label: str, fused: tuple[str, ...] = FUSED) -> dict[str, Callable[[], object]]:
    """name -> call, for the eager table."""
    from fuselab.ops import get_op

    gelu, softmax = get_op("gelu"), get_op("softmax")
    cases: dict[str, Callable[[], object]] = {"bare triton launch fp32 4096": bare_triton_launch(GELU_N, device)}
    for dtype in (torch.float32, torch.bfloat16):
        tag = {torch.float32: "fp32", torch.bfloat16: "bf16"}[dtype]
        x = torch.randn(GELU_N, device=device, dtype=dtype)
        s = torch.randn(SOFTMAX_SHAPE, device=device, dtype=dtype)
        cases[f"gelu torch {tag}"] = functools.partial(F.gelu, x, approximate="tanh")
        cases[f"softmax torch {tag}"] = functools.partial(torch.softmax, s, -1)
        for impl in fused:
            cases[f"gelu {impl} {tag}"] = functools.partial(gelu.get_impl(impl).fn, x, "tanh")
            cases[f"softmax {impl} {tag}"] = functools.partial(softmax.get_impl(impl).fn, s)
            if label == "after":  # the registered op, through the dispatcher (what compiled code and subclasses call)
                cases[f"gelu {impl} {tag} via op"] = functools.partial(
                    getattr(torch.ops.fuselab, f"gelu_{impl}"), x, "tanh"
                )
                cases[f"softmax {impl} {tag} via op"] = functools.partial(
                    getattr(torch.ops.fuselab, f"softmax_{impl}"), s
                )
    x = torch.randn(GELU_N, device=device)
    s = torch.randn(SOFTMAX_SHAPE, device=device)
    cases["fwd+bwd gelu torch fp32"] = forward_backward(lambda t: F.gelu(t, approximate="tanh"), x)
    cases["fwd+bwd softmax torch fp32"] = forward_backward(lambda t: torch.softmax(t, -1), s)
    for impl in fused:
        cases[f"fwd+bwd gelu {impl} fp32"] = forward_backward(
            functools.partial(gelu.get_impl(impl).fn, approximate="tanh"), x
        )
        cases[f"fwd+bwd softmax {impl} fp32"] = forward_backward(softmax.get_impl(impl).fn, s)
    return cases


def run_eager(args: argparse.Namespace) -> dict:
    call_cost = harness(args.harness)
    cases = eager_cases("cuda", args.label, tuple(args.fused))
    rows = {}
    for name, fn in cases.items():
        try:
            fn()  # builds, compiles
            torch.cuda.synchronize()
            c = call_cost(fn, device="cuda", budget_ms=args.budget_ms, repeats=args.repeats)
            rows[name] = {"host_us": c.host_us, "e2e_us": c.end_to_end_us, "calls": c.calls}
        except Exception as exc:  # a row with its error; the rest go on
            rows[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        print(f"{args.label:6s} {name:40s} {rows[name]}", flush=True)
    return {"label": args.label, "env": environment(), "rows": rows}


# ---------------------------------------------------------------------------------------------- study

MODES = ("eager", "max-autotune-no-cudagraphs", "reduce-overhead")


def compiled(fn: Callable, mode: str, dynamic: bool | None = None) -> Callable:
    """fn under torch.compile in `mode` (a fresh dynamo cache), or fn itself for "eager"."""
    if mode == "eager":
        return fn
    torch._dynamo.reset()
    return torch.compile(fn, mode=mode, dynamic=dynamic)


def study_impls() -> dict[str, dict[str, Callable]]:
    from fuselab.ops import get_op

    gelu, softmax = get_op("gelu"), get_op("softmax")
    return {
        "gelu": {"torch": lambda x: F.gelu(x, approximate="tanh"),
                 **{i: functools.partial(gelu.get_impl(i).fn, approximate="tanh") for i in FUSED}},
        "softmax": {"torch": lambda x: torch.softmax(x, -1), **{i: softmax.get_impl(i).fn for i in FUSED}},
    }  # fmt: skip


def study_shape(op: str, size: int) -> tuple[int, ...]:
    """GELU: `size` elements; softmax: rows of 1000 columns, about `size` elements."""
    return (size,) if op == "gelu" else (max(1, size // 1000), 1000)


def run_study(args: argparse.Namespace) -> dict:
    from fuselab.bench.timer import call_cost

    start = time.perf_counter()
    sizes = [2**k for k in range(args.min_log2, args.max_log2 + 1, args.step_log2)]
    impls = study_impls()
    points = []
    for mode in args.modes:
        for op in args.ops:
            if mode != "eager" and op not in args.compile_ops:
                continue
            for impl, fn in impls[op].items():
                if mode != "eager" and time.perf_counter() - start > args.deadline_s:
                    points.append({"op": op, "impl": impl, "mode": mode, "error": "skipped: out of time"})
                    continue
                call = compiled(fn, mode, dynamic=True)  # one graph for every size (CUDA graphs: one per size)
                for size in sizes:
                    x = torch.randn(study_shape(op, size), device="cuda")
                    point = {"op": op, "impl": impl, "mode": mode, "numel": x.numel()}
                    try:
                        with torch.no_grad():
                            call(x)
                            c = call_cost(functools.partial(call, x), device="cuda", budget_ms=args.budget_ms,
                                          repeats=3)  # fmt: skip
                        point.update(host_us=c.host_us, e2e_us=c.end_to_end_us, host_bound=c.host_bound)
                    except Exception as exc:
                        point["error"] = f"{type(exc).__name__}: {exc}"[:300]
                    points.append(point)
                    print(point, flush=True)
    mlp = run_mlp(args, start) if args.mlp else []
    return {"env": environment(), "sizes": sizes, "points": points, "gpu_bound_from": gpu_bound_from(points),
            "mlp": mlp, "wall_s": time.perf_counter() - start}  # fmt: skip


def gpu_bound_from(points: list[dict]) -> dict[str, int | None]:
    """'op impl mode' -> the smallest size from which every larger one is GPU-bound (None: host-bound throughout)."""
    out: dict[str, int | None] = {}
    keys = {(p["op"], p["impl"], p["mode"]) for p in points if "numel" in p}
    for key in sorted(keys):
        series = sorted((p["numel"], p.get("host_bound")) for p in points if (p["op"], p["impl"], p["mode"]) == key)
        first = None
        for numel, host_bound in reversed(series):
            if host_bound is not False:
                break
            first = numel
        out[" ".join(key)] = first
    return out


class MLP(torch.nn.Module):
    """Linear(1024, 4096), GELU (tanh), Linear(4096, 1024): a transformer's feed-forward block."""

    def __init__(self, act: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.up, self.down, self.act = torch.nn.Linear(1024, 4096), torch.nn.Linear(4096, 1024), act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.up(x)))


def run_mlp(args: argparse.Namespace, start: float) -> list[dict]:
    from fuselab.bench.timer import call_cost
    from fuselab.ops import get_op

    gelu = get_op("gelu")
    acts = {"F.gelu": lambda x: F.gelu(x, approximate="tanh"),
            **{f"fuselab {i}": functools.partial(gelu.get_impl(i).fn, approximate="tanh") for i in FUSED}}  # fmt: skip
    torch.manual_seed(0)
    rows = []
    for mode in args.modes:
        for name, act in acts.items():
            model = MLP(act).to("cuda", torch.bfloat16)
            for batch in (1, 4096):
                row = {"act": name, "mode": mode, "batch": batch}
                if mode != "eager" and time.perf_counter() - start > args.deadline_s:
                    rows.append({**row, "error": "skipped: out of time"})
                    continue
                try:
                    call = compiled(model, mode, dynamic=False)
                    x = torch.randn(batch, 1024, device="cuda", dtype=torch.bfloat16)
                    with torch.no_grad():
                        call(x)
                        c = call_cost(functools.partial(call, x), device="cuda", budget_ms=args.budget_ms, repeats=3)
                    row.update(host_us=c.host_us, e2e_us=c.end_to_end_us)
                except Exception as exc:
                    row["error"] = f"{type(exc).__name__}: {exc}"[:300]
                rows.append(row)
                print(row, flush=True)
    return rows


# ---------------------------------------------------------------------------------------------- merge


TARGETS = {  # (case, the reference case, factor, extra us): host_us(case) <= factor * host_us(reference) + extra
    "gelu cuda fp32": ("gelu torch fp32", 1.5, 0.0),
    "gelu cuda bf16": ("gelu torch bf16", 1.5, 0.0),
    "softmax cuda fp32": ("softmax torch fp32", 1.5, 0.0),
    "softmax cuda bf16": ("softmax torch bf16", 1.5, 0.0),
    "gelu triton fp32": ("bare triton launch fp32 4096", 1.0, 5.0),
    "gelu triton bf16": ("bare triton launch fp32 4096", 1.0, 5.0),
    "softmax triton fp32": ("bare triton launch fp32 4096", 1.0, 5.0),
    "softmax triton bf16": ("bare triton launch fp32 4096", 1.0, 5.0),
    "fwd+bwd gelu cuda fp32": ("fwd+bwd gelu torch fp32", 1.5, 0.0),
    "fwd+bwd softmax cuda fp32": ("fwd+bwd softmax torch fp32", 1.5, 0.0),
    "fwd+bwd gelu triton fp32": ("fwd+bwd gelu torch fp32", 2.0, 0.0),
    "fwd+bwd softmax triton fp32": ("fwd+bwd softmax torch fp32", 2.0, 0.0),
}


def run_merge(args: argparse.Namespace) -> dict:
    before = json.loads(Path(args.before).read_text()) if args.before else None
    after = json.loads(Path(args.after).read_text())
    study = json.loads(Path(args.study).read_text()) if args.study else None
    table = []
    for name, row in after["rows"].items():
        entry = {"case": name, "after_host_us": row.get("host_us"), "after_e2e_us": row.get("e2e_us")}
        if before and name in before["rows"]:
            entry.update(
                before_host_us=before["rows"][name].get("host_us"), before_e2e_us=before["rows"][name].get("e2e_us")
            )
        if name in TARGETS:
            ref, factor, extra = TARGETS[name]
            ref_us = after["rows"].get(ref, {}).get("host_us")
            if ref_us is not None and row.get("host_us") is not None:
                entry["target_us"] = factor * ref_us + extra
                entry["meets_target"] = row["host_us"] <= entry["target_us"]
        table.append(entry)
    merged = {
        "about": "host us/call and end-to-end us/call of back-to-back calls (fuselab.bench.timer.call_cost); before: "
        "the package before the call-cost work, after: with it, same machine, same command",
        "eager": table,
        "before_env": before and before["env"],
        "after_env": after["env"],
        "study": study,
    }
    if args.plot and study:
        plot(study, Path(args.plot))
    return merged


def plot(study: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ops = sorted({p["op"] for p in study["points"]})
    fig, axes = plt.subplots(1, len(ops), figsize=(7 * len(ops), 5), squeeze=False)
    styles = {"eager": "-", "max-autotune-no-cudagraphs": "--", "reduce-overhead": ":"}
    for ax, op in zip(axes[0], ops, strict=True):
        keys = sorted({(p["impl"], p["mode"]) for p in study["points"] if p["op"] == op and "e2e_us" in p})
        for impl, mode in keys:
            pts = sorted((p["numel"], p["e2e_us"]) for p in study["points"]
                         if (p["op"], p["impl"], p["mode"]) == (op, impl, mode) and "e2e_us" in p)  # fmt: skip
            ax.plot([n for n, _ in pts], [u for _, u in pts], styles.get(mode, "-"), marker="o", ms=3,
                    label=f"{impl}, {mode}")  # fmt: skip
        ax.set(xscale="log", yscale="log", xlabel="elements (fp32)", ylabel="us per call, back to back",
               title=f"{op}: end to end per call")  # fmt: skip
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    e = sub.add_parser("eager")
    e.add_argument("--label", default="after")
    e.add_argument("--harness", help="timer.py to take call_cost from (a package older than it)")
    e.add_argument("--fused", nargs="+", default=list(FUSED), choices=FUSED, help="the fused impls to time")
    s = sub.add_parser("study")
    s.add_argument("--ops", nargs="+", default=["gelu", "softmax"])
    s.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    s.add_argument("--compile-ops", nargs="+", default=["gelu"], help="ops also timed under torch.compile")
    s.add_argument("--min-log2", type=int, default=10)
    s.add_argument("--max-log2", type=int, default=25)
    s.add_argument("--step-log2", type=int, default=3)
    s.add_argument("--deadline-s", type=float, default=120.0, help="compiled cases after this many seconds: skipped")
    s.add_argument("--no-mlp", dest="mlp", action="store_false")
    for p in (e, s):
        p.add_argument("--budget-ms", type=float, default=60.0, help="call_cost's time per case")
        p.add_argument("--repeats", type=int, default=5)
    m = sub.add_parser("merge")
    m.add_argument("--before")
    m.add_argument("--after", required=True)
    m.add_argument("--study")
    m.add_argument("--plot")
    for p in (e, s, m):
        p.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    if args.command != "merge" and not torch.cuda.is_available():
        print("call_cost.py eager/study need a CUDA GPU", file=sys.stderr)
        return 2
    result = {"eager": run_eager, "study": run_study, "merge": run_merge}[args.command](args)
    Path(args.out).write_text(json.dumps(result, indent=1, default=str))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TORCHINDUCTOR_MAX_AUTOTUNE_GEMM_BACKENDS", "ATEN")  # study time: no GEMM autotuning
    sys.exit(main())
