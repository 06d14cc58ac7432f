"""The guards a compiled model evaluates before every call, timed alone: torch.nn's modules against fuselab.nn's.

Dynamo turns every object a model reads while it is traced into a guard, which each later call checks before it runs
the compiled code. A drop-in that reaches its kernel through more objects (a dict, a closure, an input check) costs
that much more host time a call. Models: a feed-forward block `Linear(d, 4d), GELU (tanh), Linear(4d, d)` and a
`Linear(d, d), Softmax(dim=-1)`, each with torch.nn's module and with fuselab's default drop-in (impl "auto"), bf16,
one row of d 64. Each model is compiled in a process of its own (what else a process compiled changes the guards),
and its guard manager is checked alone (`guard_manager.check` on the call's locals, a private API of torch's Dynamo),
`--checks` times a round: the median of `--rounds` rounds, in µs. The models take turns, each in `--repeats` processes
(the host drifts between processes by as much as the differences measured): the median over them, their range, and
the number of lines of the guard tree. Each process's figure is printed as it comes (a process takes 8-20 s: import,
compile), and `--out` is rewritten after each repeat, with the repeats done in its meta.

    PYTHONPATH=src python3 benchmarks/compiled_guards.py               # cuda where there is one, else cpu
    PYTHONPATH=src python3 benchmarks/compiled_guards.py --device cpu --out guards.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

MODELS = ("gelu-torch", "gelu-fuselab", "softmax-torch", "softmax-fuselab")


def build(name: str, device: str) -> torch.nn.Module:
    """Model `name` (one of MODELS), bf16 on `device`."""
    import fuselab.nn

    op, source = name.split("-")
    d = 64
    if op == "gelu":
        act = torch.nn.GELU(approximate="tanh") if source == "torch" else fuselab.nn.GELU(approximate="tanh")
        layers = [torch.nn.Linear(d, 4 * d), act, torch.nn.Linear(4 * d, d)]
    else:
        layers = [torch.nn.Linear(d, d), torch.nn.Softmax(dim=-1) if source == "torch" else fuselab.nn.Softmax(dim=-1)]
    return torch.nn.Sequential(*layers).to(device=device, dtype=torch.bfloat16)


def measure(name: str, device: str, rounds: int, checks: int) -> dict:
    """In this process: model `name` compiled and called once, then its guards checked `checks` times a round."""
    from torch._dynamo import external_utils
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    torch.manual_seed(0)
    model = build(name, device)
    x = torch.randn(1, 64, device=device, dtype=torch.bfloat16)
    with torch.no_grad():
        torch.compile(model)(x)
        (entry,) = _debug_get_cache_entry_list(external_utils.wrap_inline(model).__code__)
        guards, frame = entry.guard_manager, {"args": (x,), "kwargs": {}, "fn": model}
        if not guards.check(frame):
            raise RuntimeError(f"{name}: the guards fail on the call they were made for")
        times = []
        for _ in range(rounds):
            start = time.perf_counter()
            for _ in range(checks):
                guards.check(frame)
            times.append((time.perf_counter() - start) / checks * 1e6)
    return {"model": name, "guard_us": statistics.median(times), "guard_lines": str(guards).count("\n")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--checks", type=int, default=5000, help="guard checks a round")
    p.add_argument("--repeats", type=int, default=5, help="processes a model, taking turns")
    p.add_argument("--out", type=Path, help="results JSON")
    p.add_argument("--one", choices=MODELS, help=argparse.SUPPRESS)  # the child process: one model
    args = p.parse_args(argv)
    if args.one:
        print(json.dumps(measure(args.one, args.device, args.rounds, args.checks)))
        return 0
    runs: dict[str, list[dict]] = {name: [] for name in MODELS}
    for repeat in range(args.repeats):
        for name in MODELS:
            start = time.perf_counter()
            command = [sys.executable, __file__, "--one", name, "--device", args.device, "--rounds", str(args.rounds)]
            done = subprocess.run([*command, "--checks", str(args.checks)], capture_output=True, text=True, check=False)
            if done.returncode != 0:
                print(f"{name}: failed\n{done.stderr[-2000:]}", file=sys.stderr)
                return 1
            runs[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
            us, took = runs[name][-1]["guard_us"], time.perf_counter() - start
            print(f"  {repeat + 1}/{args.repeats} {name:16} {us:6.2f} µs ({took:.0f} s)", flush=True)
        if args.out:  # after each repeat: a run cut short keeps the repeats it finished
            write(args.out, summarize(runs), args.device, repeat + 1)
    for row in summarize(runs):
        (lo, hi), lines = row["range_us"], row["guard_lines"]
        print(f"{row['model']:16} {row['guard_us']:6.2f} µs [{lo:.2f}, {hi:.2f}]  {lines:4d} lines of guards")
    return 0


def summarize(runs: dict[str, list[dict]]) -> list[dict]:
    """Per model: the median guard time over its processes (µs), their range, and its guard tree's lines."""
    rows = []
    for name, measured in runs.items():
        us = [m["guard_us"] for m in measured]
        rows.append({"model": name, "guard_us": statistics.median(us), "range_us": [min(us), max(us)],
                     "guard_lines": measured[0]["guard_lines"]})  # fmt: skip
    return rows


def write(out: Path, rows: list[dict], device: str, repeats: int) -> None:
    from fuselab.bench.env import environment

    meta = {"env": environment(), "device": device, "repeats": repeats}
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
