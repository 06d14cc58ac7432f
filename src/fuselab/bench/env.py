"""What a result was measured on: device, library versions. Recorded with every result."""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform

import torch


def triton_version() -> str | None:
    try:
        return importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        return None


def device_name(device: str | torch.device) -> str:
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    return platform.processor() or platform.machine() or "cpu"


@functools.cache
def environment(device: str = "cuda" if torch.cuda.is_available() else "cpu") -> dict[str, object]:
    """gpu (or CPU) name, versions of torch, Triton, CUDA, Python, and the driver where there is one."""
    env: dict[str, object] = {
        "device": torch.device(device).type,
        "gpu": device_name(device) if torch.device(device).type == "cuda" else None,
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "triton": triton_version(),
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
    }
    if torch.device(device).type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(
            capability=f"{props.major}.{props.minor}",
            sm_count=props.multi_processor_count,
            l2_bytes=getattr(props, "L2_cache_size", None),
            memory_bytes=props.total_memory,
            driver=_driver_version(),
        )
    return env


def _driver_version() -> str | None:
    try:
        import subprocess

        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.SubprocessError):
        return None
