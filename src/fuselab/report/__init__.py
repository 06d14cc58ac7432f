"""The report: the lecture's studies run end to end on this device, as report.md, report.html, plots and JSON.

from fuselab.report import run_full_report
run_full_report("report", quick=True)
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch
from rich.console import Console

from fuselab.bench import distributed
from fuselab.report.budgets import BUDGETS, mode_for
from fuselab.report.runner import Context, Section, run_report, run_section


def resolve_device(device: str | None) -> str:
    """cuda when there is a GPU, else cpu; a named device is checked (ValueError naming what is accepted)."""
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        kind = torch.device(device).type
    except RuntimeError:
        raise ValueError(f"unknown device {device!r}; accepted: cpu, cuda, cuda:N") from None
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"the report runs on cpu or cuda, not {kind}")
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r}: no CUDA GPU in this process; use cpu")
    return device


def run_full_report(
    out: str | Path = "report",
    *,
    device: str | None = None,
    quick: bool = False,
    fresh: bool = False,
    only: Sequence[str] | None = None,
    sections: Sequence[Section] | None = None,
    console: Console | None = None,
    show_progress: bool = True,
) -> dict[str, dict]:
    """Run (or resume) every section into `out`; return the section records by name."""
    from fuselab.report.sections import sections as all_sections

    device = resolve_device(device)
    mode = mode_for(device, quick)
    ctx = Context(out=Path(out), device=device, mode=mode, budget=BUDGETS[mode], show_progress=show_progress)
    if not distributed.is_main():  # under torchrun: sweeps share OUT's logs; rank 0 alone writes the report
        with tempfile.TemporaryDirectory(prefix=f"fuselab-report-rank{distributed.rank()}-") as scratch:
            ctx.out, ctx.logs, ctx.show_progress = Path(scratch), Path(out), False
            return run_report(sections or all_sections(), ctx, fresh=fresh, only=only, console=console)
    return run_report(sections or all_sections(), ctx, fresh=fresh, only=only, console=console)


__all__ = ["Context", "Section", "resolve_device", "run_full_report", "run_report", "run_section"]
