"""Time the Triton softmax's kernel choices on this GPU, to set the thresholds in triton.py.

    python -m fuselab.ops.softmax.tune                      # fp32 and bf16 at every bench width
    python -m fuselab.ops.softmax.tune --dtype bf16 --width 256 --width 32768 --elements 2^24

For each width (rows = elements / width) it times the plan `forward_plan` picks and alternatives: register caps,
other tile sizes and warp counts for the rows kernel, the persistent rows-ahead kernel, chunk sizes and warps for
the split kernels, the looped kernel; and torch.softmax and torch.compile (of the naive softmax). Each plan is checked
against the float64 reference first. Printed: GB/s (bytes read + written) per plan, the best one, and the chosen
plan's time against the two references'. Timing by fuselab.bench, all of a width's plans taking turns
(benchmark_side_by_side: warm-up, L2 flush, CUDA events).
"""

from __future__ import annotations

import argparse
import functools
import json
from collections.abc import Callable
from dataclasses import asdict, replace

import torch
import triton

from fuselab.bench.compiled import WatchedCompile
from fuselab.bench.timer import benchmark_side_by_side
from fuselab.ops.evaluate import parse_dtype, relative_error
from fuselab.ops.registry import parse_shape
from fuselab.ops.softmax import triton as st
from fuselab.ops.softmax.spec import SOFTMAX, WIDTHS


def candidates(width: int, dtype: torch.dtype, device: torch.device) -> list[st.Plan]:
    """The chosen plan first, then alternatives around it (each at most once)."""
    block = triton.next_power_of_2(width)
    item = dtype.itemsize
    chosen = st.forward_plan(width, dtype, device)
    plans = [chosen]
    if chosen.kernel == "rows":  # register caps that let one more program fit, and none
        plans += [replace(chosen, maxnreg=cap) for cap in (None, 32, 40, 48, 64)]
    if block >= 16384 and block <= st.ROW_MAX:
        plans += [st.Plan("rows_ahead", block, 1, warps) for warps in (16, 32)]
    if item == 2 and 4096 <= block <= st.ROW_MAX:  # held in 16 bits: half the registers
        plans += [st.Plan("rows", block, 1, w, cap, hold=True) for w in (8, 16, 32) for cap in (None, 40)]
    if block <= 2 * st.ROW_MAX:
        for tile_bytes in (2048, 4096, 8192, 16384):
            rows = max(1, tile_bytes // (block * item))
            warps = st._warps(block * rows, item)
            plans += [st.Plan("rows", block, rows, w) for w in (max(1, warps // 2), warps, min(32, 2 * warps))]
    if width > 4096 and st._can_wait(device):  # the split kernels wait for each other: a GPU only
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        kernels = ("split", "split_pairs") if dtype == torch.bfloat16 and width % 2 == 0 else ("split",)
        for kernel in kernels:
            for chunk in (8192, 16384, 32768):
                held = chunk // 2 if kernel == "split_pairs" else chunk  # registers' worth per program
                plans += [
                    st.Plan(kernel, chunk, 1, warps)
                    for warps in (4, 8, 16, 32)
                    if 1 < triton.cdiv(width, chunk) <= sms and 8 <= held // (32 * warps) <= 64
                ]
    if width > 4096:
        plans.append(st.Plan("looped", st.LOOP_BLOCK, 1, 8))
    return list(dict.fromkeys(plans))


def gbps(nbytes: int, ms: float) -> float:
    return nbytes / ms / 1e6


def tune_width(width: int, dtype: torch.dtype, elements: int, device: torch.device, quick: bool) -> dict:
    """Time every candidate at (elements // width, width), side by side with torch.softmax and torch.compile of the
    naive softmax (all take turns, `benchmark_side_by_side`); returns {plan: ms and GB/s, or its error} and the two
    references' ms and GB/s."""
    rows = max(1, elements // width)
    (x,) = SOFTMAX.make_inputs((rows, width), dtype, str(device), 0)
    check_rows = slice(0, min(rows, 64))  # the reference on a few rows: float64 of all of x is large
    ref = SOFTMAX.reference(x[check_rows])
    nbytes = SOFTMAX.bytes_moved((rows, width), dtype)
    timing = {"warmup_ms": 10, "rep_ms": 20, "min_reps": 3} if quick else {"warmup_ms": 50, "rep_ms": 150}
    y = torch.empty_like(x)
    wrong: dict[st.Plan, dict] = {}
    calls: dict[object, Callable[[], object]] = {}  # keyed by plan, or "torch" / "compile"
    plans = candidates(width, dtype, device)
    for plan in plans:
        y.fill_(float("nan"))
        st.launch_forward(x, y, plan)
        err = relative_error(y[check_rows], ref)
        if err <= SOFTMAX.tolerance[dtype]:
            calls[plan] = functools.partial(st.launch_forward, x, y, plan)
        else:
            wrong[plan] = {"error": f"rel err {err:.2e}"}
    compiled = WatchedCompile(SOFTMAX.get_impl("compile").fn)  # as `fuselab bench` times it
    calls["torch"] = lambda: torch.softmax(x, dim=-1)
    calls["compile"] = lambda: compiled(x)
    timed = benchmark_side_by_side(calls, device=device, **timing)
    speed = {key: {"ms": m.median_ms, "gbps": gbps(nbytes, m.median_ms)} for key, m in timed.items()}
    results = {plan: wrong.get(plan) or speed[plan] for plan in plans}
    return {"rows": rows, "plans": results, "torch": speed["torch"], "compile": speed["compile"]}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m fuselab.ops.softmax.tune", description=__doc__.split("\n\n")[0])
    p.add_argument("--dtype", action="append", help="fp32, bf16, fp16 (repeatable; default fp32 and bf16)")
    p.add_argument("--width", action="append", type=int, help="row width (repeatable; default the bench widths)")
    p.add_argument("--elements", default="2^26", help="elements per tensor (default 2^26: 256 MiB in fp32)")
    p.add_argument("--quick", action="store_true", help="fewer repetitions")
    p.add_argument("--json", help="also append one JSON line per width and dtype to this file")
    args = p.parse_args(argv)
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    dtypes = [parse_dtype(d) for d in args.dtype or ["fp32", "bf16"]]
    (elements,) = parse_shape(args.elements)
    for dtype in dtypes:
        for width in args.width or WIDTHS:
            out = tune_width(width, dtype, elements, device, args.quick)
            chosen = next(iter(out["plans"]))
            timed = {plan: r for plan, r in out["plans"].items() if "ms" in r}
            best = min(timed, key=lambda plan: timed[plan]["ms"])
            name = str(dtype).removeprefix("torch.")
            print(f"\n{name} width {width} ({out['rows']} rows): torch.softmax {out['torch']['gbps']:.0f} GB/s,"
                  f" torch.compile {out['compile']['gbps']:.0f}")  # fmt: skip
            for plan, r in out["plans"].items():
                mark = ("chosen " if plan == chosen else "       ") + ("best" if plan == best else "    ")
                shown = f"{r['gbps']:7.0f} GB/s" if "gbps" in r else r["error"]
                print(f"  {mark} {shown}  {plan}")
            if chosen in timed:
                ms = timed[chosen]["ms"]
                vs_torch, vs_compile = ms / out["torch"]["ms"], ms / out["compile"]["ms"]
                print(f"  chosen / torch time: {vs_torch:.3f}x, / compile: {vs_compile:.3f}x")
            if args.json:
                with open(args.json, "a") as f:
                    row = {"dtype": str(dtype), "width": width, **out}
                    row["plans"] = [{**asdict(plan), **r} for plan, r in out["plans"].items()]
                    f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
