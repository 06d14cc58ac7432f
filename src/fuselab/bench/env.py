"""What a result was measured on (device, library versions) and by what (git revision, host, time, threads).
Recorded with every result."""

from __future__ import annotations

import datetime
import functools
import importlib.metadata
import os
import platform
import socket
import subprocess
from pathlib import Path

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
        "cpu_model": cpu_model(),
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


def _cpuinfo(field: str) -> str | None:
    """The first value of `field` in Linux's /proc/cpuinfo, or None where there is no such file or field."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                name, sep, value = line.partition(":")
                if sep and name.strip() == field:
                    return value.strip()
    except OSError:
        pass
    return None


def cpu_model() -> str:
    """The CPU's model name ('AMD EPYC 9654 96-Core Processor'), else what platform knows of it."""
    return _cpuinfo("model name") or platform.processor() or platform.machine() or "unknown"


def cpu_clocks() -> dict[str, float] | None:
    """{"cpu_mhz": the first CPU's clock now, in MHz} from /proc/cpuinfo, or None where it cannot be read."""
    try:
        return {"cpu_mhz": float(_cpuinfo("cpu MHz"))}  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def gpu_clocks(index: int = 0) -> dict[str, list[int]] | None:
    """{"sm_mhz": [current, max], "memory_mhz": [current, max]} of GPU `index` from nvidia-smi, or None where it
    cannot say."""
    query = "--query-gpu=clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem"
    try:
        done = subprocess.run(
            ["nvidia-smi", query, "--format=csv,noheader,nounits", "-i", str(index)],
            capture_output=True,
            text=True,
            timeout=10,
        )
        sm, sm_max, mem, mem_max = (int(v) for v in done.stdout.split(","))
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return {"sm_mhz": [sm, sm_max], "memory_mhz": [mem, mem_max]} if done.returncode == 0 else None


def _driver_version() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.SubprocessError):
        return None


ROOT = Path(__file__).resolve().parents[3]  # the repository of a source checkout: src/fuselab/bench -> .


def revision() -> tuple[str, bool | None]:
    """(git commit, whether the tree differs from it) of the checkout fuselab runs from: FUSELAB_REVISION where
    given (a copy without .git, as on the GPU machine; dirty then unknown: None), else git's; ("unknown", None)
    outside a checkout."""
    if os.environ.get("FUSELAB_REVISION"):
        return os.environ["FUSELAB_REVISION"], None
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True
        )
        return head.stdout.strip(), bool(status.stdout.strip()) if status.returncode == 0 else None
    except (OSError, subprocess.CalledProcessError):
        return "unknown", None


def now() -> str:
    """The time in UTC, ISO 8601 to the second."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def provenance(device: str = "cuda" if torch.cuda.is_available() else "cpu") -> dict[str, object]:
    """`environment(device)` and who measured when: the git revision and whether the tree was dirty, fuselab's
    version, the host, torch's intra-op threads (as torch.utils.benchmark records them), the clocks where they can be
    read (`gpu_clocks` on a GPU, `cpu_clocks` on the CPU; None where not), and the time."""
    from fuselab import __version__

    commit, dirty = revision()
    dev = torch.device(device)
    clocks = gpu_clocks(dev.index or 0) if dev.type == "cuda" else cpu_clocks()
    return {
        **environment(device),
        "revision": commit,
        "dirty": dirty,
        "fuselab": __version__,
        "host": socket.gethostname(),
        "threads": torch.get_num_threads(),
        "clocks": clocks,
        "written": now(),
    }


@functools.cache
def _revision_once(given: str | None) -> tuple[str, bool | None]:
    """`revision()`, read once a process (per FUSELAB_REVISION, `given`)."""
    return revision()


def row_provenance(device: str = "cuda" if torch.cuda.is_available() else "cpu") -> dict[str, object]:
    """What each row of a results log carries of its provenance (a log outlives a run: a resumed one mixes runs):
    the device, GPU, torch, Triton and CUDA versions, the revision (read once a process) and whether the tree was
    dirty, the host, torch's threads and the time the row was written. The file's meta has the rest (`provenance`)."""
    env = environment(device)
    commit, dirty = _revision_once(os.environ.get("FUSELAB_REVISION"))
    return {
        **{k: env[k] for k in ("device", "gpu", "torch", "triton", "cuda")},
        "revision": commit,
        "dirty": dirty,
        "host": socket.gethostname(),
        "threads": torch.get_num_threads(),
        "written": now(),
    }
