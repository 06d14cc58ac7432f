"""`fuselab device`: measure (or show the cached) limits of the device: copy GB/s, matmul TFLOP/s, launch."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from fuselab.bench import distributed
from fuselab.bench.ceilings import busy_note, get_ceilings, measure_ceilings
from fuselab.bench.results import fmt_rate
from fuselab.cli._args import add_device_argument, check_writable


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("device", help="measure the device's ceilings (cached per device and driver)")
    add_device_argument(p)
    p.add_argument("--refresh", action="store_true", help="measure again even if cached")
    p.add_argument("--quick", action="store_true", help="small sizes, not cached (a rough look)")
    p.add_argument("--out", type=Path, help="also write the result as JSON here")
    p.add_argument(
        "--interconnect",
        choices=("auto", "on", "off"),
        default="auto",
        help="GPU-to-GPU copy and NCCL all-reduce ceilings (auto: on a host with 2+ GPUs or under torchrun)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    check_writable(args.out)
    if args.quick:
        result = measure_ceilings(args.device, quick=True)
    else:
        result = get_ceilings(args.device, refresh=args.refresh)
    if args.interconnect == "on" or (
        args.interconnect == "auto" and (torch.cuda.device_count() > 1 or distributed.active())
    ):
        from fuselab.bench.interconnect import measure_interconnect

        result = {**result, "interconnect": measure_interconnect(quick=args.quick)}
    if not distributed.is_main():
        return 0
    Console().print(ceilings_table(result))
    if busy_note(result):
        Console(highlight=False).print(f"[yellow]{busy_note(result)}[/yellow]", soft_wrap=True)
    if "interconnect" in result:
        for table in interconnect_tables(result["interconnect"]):
            Console().print(table)
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


def interconnect_tables(ic: dict) -> list[Table]:
    """Link types and peer copies (GPU pairs), and all-reduce bus bandwidth against message size."""
    tables = []
    links = (ic.get("topology") or {}).get("links", {})
    copies = ic.get("peer_copy") or []
    if links or copies:
        pairs = Table(title="GPU pairs (device-to-device copy; bytes copied once)")
        for name in ("from", "to", "link (nvidia-smi topo -m)", "copy GB/s", "MiB"):
            pairs.add_column(name)
        for row in copies:
            link = links.get(f"{min(row['src'], row['dst'])}-{max(row['src'], row['dst'])}", "")
            pairs.add_row(str(row["src"]), str(row["dst"]), link, f"{row['gbps']:.0f}", f"{row['bytes'] / 2**20:.0f}")
        tables.append(pairs)
    allreduce = ic.get("allreduce") or {}
    nvls = ic.get("nccl_nvls_enable")
    reduce = Table(title=f"all-reduce over {allreduce.get('ranks')} ranks (nccl-tests' busbw; NCCL_NVLS_ENABLE={nvls})")
    for name in ("size", "time us", "algbw GB/s", "busbw GB/s"):
        reduce.add_column(name)
    for row in allreduce.get("rows", []):
        size = row["bytes"]
        label = (
            f"{size / 2**30:g} GiB"
            if size >= 2**30
            else f"{size / 2**20:g} MiB"
            if size >= 2**20
            else f"{size / 2**10:g} KiB"
        )
        reduce.add_row(label, f"{row['time_us']:.1f}", f"{row['algbw_gbps']:.1f}", f"{row['busbw_gbps']:.1f}")
    tables.append(reduce)
    return tables
