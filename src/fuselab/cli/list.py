"""`fuselab list`: every op, its impls, and whether each runs on this device (and why not)."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from fuselab.cli._args import add_device_argument, default_device
from fuselab.evaluate import impl_statuses


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("list", help="the ops, their impls, and whether each runs on this device")
    add_device_argument(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    device = args.device or default_device()
    table = Table(title=f"ops and impls on {device}", title_justify="left")
    for column in ("op", "impl", "kernels", "backward", "runs here"):
        table.add_column(column)
    for s in impl_statuses(device):
        kernels = "torch.compile's" if s.compiled else "PyTorch's" if s.upstream else "fuselab's"
        here = "[green]yes[/green]" if s.reason is None else f"[yellow]no[/yellow]: {s.reason}"
        if s.interpreted and s.reason is None:
            here += " (Triton's interpreter: right but slow, fp32 only; never timed)"
        table.add_row(s.op, s.impl, kernels, "yes" if s.backward else "", here)
    Console(highlight=False).print(table)
    return 0
