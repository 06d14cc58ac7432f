"""`fuselab device`: measure (or show the cached) limits of the device: copy GB/s, matmul TFLOP/s, launch."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from fuselab.bench.ceilings import get_ceilings, measure_ceilings
from fuselab.bench.results import fmt_rate
from fuselab.cli._args import add_device_argument, check_writable


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("device", help="measure the device's ceilings (cached per device and driver)")
    add_device_argument(p)
    p.add_argument("--refresh", action="store_true", help="measure again even if cached")
    p.add_argument("--quick", action="store_true", help="small sizes, not cached (a rough look)")
    p.add_argument("--out", type=Path, help="also write the result as JSON here")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    check_writable(args.out)
    if args.quick:
        result = measure_ceilings(args.device, quick=True)
    else:
        result = get_ceilings(args.device, refresh=args.refresh)
    Console().print(ceilings_table(result))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


def flops_rate(tflops: float) -> str:
    """TFLOP/s at 1 and above, GFLOP/s below (a CPU's 0.04 TFLOP/s reads '41.2 GFLOP/s', not '0.0 TFLOP/s')."""
    return f"{fmt_rate(tflops)} TFLOP/s" if tflops >= 1 else f"{fmt_rate(tflops * 1e3)} GFLOP/s"


def ceilings_table(c: dict) -> Table:
    env = c["env"]
    table = Table(title=f"device ceilings: {env['gpu'] or env['cpu']}", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value")
    table.add_row("copy bandwidth", f"{fmt_rate(c['copy_gbps'])} GB/s (bytes read + written)")
    for name, tflops in c["matmul_tflops"].items():
        table.add_row(f"matmul {name} ({c['matmul_n']}³)", flops_rate(tflops))
    table.add_row("launch (host)", f"{c['launch_us']:.1f} us")
    table.add_row("tiny kernel (device)", f"{c['tiny_kernel_us']:.1f} us")
    for key in ("cpu_count", "sm_count", "l2_bytes", "memory_bytes", "driver"):
        if env.get(key) is not None:
            table.add_row(key, str(env[key]))
    table.add_row("torch / triton", f"{env['torch']} / {env['triton']}")
    return table
