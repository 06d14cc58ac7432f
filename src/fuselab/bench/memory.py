"""How much memory a device has free, to refuse a case that cannot fit before it allocates anything."""

from __future__ import annotations

import os
from pathlib import Path

import torch


def free_bytes(device: str | torch.device) -> int | None:
    """Bytes that can still be allocated on `device`, or None when unknown.

    CPU: MemAvailable of /proc/meminfo (what the kernel can hand out without swapping), else the free physical pages
    (os.sysconf). CUDA: the driver's free memory (torch.cuda.mem_get_info) plus what torch's caching allocator holds
    reserved but unused (it hands that out again without asking the driver).
    """
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            return None
        free, _total = torch.cuda.mem_get_info(dev)
        cached = torch.cuda.memory_reserved(dev) - torch.cuda.memory_allocated(dev)
        return int(free + max(cached, 0))
    if dev.type != "cpu":
        return None
    meminfo = Path("/proc/meminfo")
    if meminfo.exists():
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024  # the file counts in KiB
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not on this platform
        return None


def format_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'; binary units, three significant figures."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1024
    return f"{n:.3g} TiB"
