"""`fuselab device`: measure (or show the cached) limits of the device: copy GB/s, matmul TFLOP/s, launch."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from fuselab.bench.ceilings import get_ceilings, measure_ceilings


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("device", help="measure the device's ceilings (cached per device and driver)")
    p.add_argument("--device", default=None, help="cuda, cuda:1 or cpu (default: the GPU if any)")
    p.add_argument("--refresh", action="store_true", help="measure again even if cached")
    p.add_argument("--quick", action="store_true", help="small sizes, not cached (a rough look)")
    p.add_argument("--out", type=Path, help="also write the result as JSON here")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.quick:
        result = measure_ceilings(args.device, quick=True)
    else:
        result = get_ceilings(args.device, refresh=args.refresh)
    Console().print(ceilings_table(result))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


def ceilings_table(c: dict) -> Table:
    env = c["env"]
    table = Table(title=f"device ceilings: {env['gpu'] or env['cpu']}", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value")
    table.add_row("copy bandwidth", f"{c['copy_gbps']:.0f} GB/s (bytes read + written)")
    for name, tflops in c["matmul_tflops"].items():
        table.add_row(f"matmul {name} ({c['matmul_n']}³)", f"{tflops:.1f} TFLOP/s")
    table.add_row("launch (host)", f"{c['launch_us']:.1f} us")
    table.add_row("tiny kernel (device)", f"{c['tiny_kernel_us']:.1f} us")
    for key in ("cpu_count", "sm_count", "l2_bytes", "memory_bytes", "driver"):
        if env.get(key) is not None:
            table.add_row(key, str(env[key]))
    table.add_row("torch / triton", f"{env['torch']} / {env['triton']}")
    return table
