"""The ceilings between GPUs of a host: device-to-device copy GB/s per pair, NCCL all-reduce bus bandwidth against
message size (as nccl-tests reports it), and the link type `nvidia-smi topo -m` shows.

    fuselab device                       (on a host with 2+ GPUs it adds these to the device's own ceilings)
    torchrun --nproc-per-node 8 -m fuselab device

Bus bandwidth follows nccl-tests (doc/PERFORMANCE.md): algbw = bytes / time; for all-reduce,
busbw = algbw * 2(n-1)/n, the rate each link must carry, comparable across rank counts and with the link's speed.
Time is the slowest rank's mean over `iters` back-to-back calls after `warmup` calls. NVLink multicast (NVLS) is off
(NCCL_NVLS_ENABLE=0) unless the environment sets it. This module knows no op.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
import uuid

import torch
import torch.distributed as dist

from fuselab.bench import distributed

KiB, MiB, GiB = 2**10, 2**20, 2**30


def message_sizes(lo: int = 8 * KiB, hi: int = GiB, factor: int = 2) -> list[int]:
    """lo, lo*factor, ... up to hi (bytes), as nccl-tests' -b/-e/-f."""
    if lo < 4 or hi < lo or factor < 2:
        raise ValueError(f"message sizes need 4 <= lo <= hi and factor >= 2, got {lo}, {hi}, {factor}")
    sizes = [lo]
    while sizes[-1] * factor <= hi:
        sizes.append(sizes[-1] * factor)
    return sizes


def bus_bandwidth(nbytes: int, seconds: float, ranks: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s of an all-reduce of `nbytes` taking `seconds` over `ranks` ranks (nccl-tests)."""
    algbw = nbytes / seconds / 1e9
    return algbw, algbw * 2 * (ranks - 1) / ranks


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def parse_topology(text: str) -> dict[str, object]:
    """The GPU-to-GPU part of `nvidia-smi topo -m`: {"gpus": n, "links": {"0-1": "NV18", ...}} (each unordered pair
    once; X on the diagonal is left out). Legend lines and NIC rows are ignored."""
    lines = [_ANSI.sub("", line).rstrip() for line in text.splitlines() if line.strip()]
    header = next((line.split() for line in lines if line.split() and line.split()[0].startswith("GPU0")), None)
    columns = [c for c in header or [] if re.fullmatch(r"GPU\d+", c)]
    links: dict[str, str] = {}
    for line in lines:
        cells = line.split()
        if not cells or not re.fullmatch(r"GPU\d+", cells[0]) or line.startswith(("\t", " ")):
            continue
        i = int(cells[0][3:])
        for col, kind in zip(columns, cells[1 : 1 + len(columns)], strict=False):
            j = int(col[3:])
            if i < j:
                links[f"{i}-{j}"] = kind
    return {"gpus": len(columns), "links": links}


def topology() -> dict[str, object] | None:
    """parse_topology of this host's `nvidia-smi topo -m` with the raw text, or None without nvidia-smi."""
    try:
        out = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return {**parse_topology(out.stdout), "text": out.stdout}


def peer_copies(nbytes: int = GiB, reps: int = 10, warmup: int = 3) -> list[dict[str, object]]:
    """GB/s of copying `nbytes` from GPU i to GPU j, for every ordered pair (one process sees all GPUs).

    Timed with CUDA events on the source GPU's stream, which PyTorch issues a cross-device copy on (after waiting
    for the destination's stream); GB/s counts the bytes copied once (not read + written)."""
    n = torch.cuda.device_count()
    rows = []
    for src in range(n):
        for dst in range(n):
            if src == dst:
                continue
            a = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{src}").random_(0, 255)
            b = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{dst}")
            for _ in range(warmup):
                b.copy_(a)
            torch.cuda.synchronize(src)
            torch.cuda.synchronize(dst)
            times = []
            with torch.cuda.device(src):
                for _ in range(reps):
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    b.copy_(a)
                    end.record()
                    end.synchronize()
                    times.append(start.elapsed_time(end) * 1e-3)
            torch.cuda.synchronize(dst)
            if not torch.equal(a[:4096], b[:4096]):
                raise RuntimeError(f"the copy from cuda:{src} to cuda:{dst} came out wrong")
            times.sort()
            median = times[len(times) // 2]
            rows.append(
                {
                    "src": src,
                    "dst": dst,
                    "bytes": nbytes,
                    "median_ms": median * 1e3,
                    "gbps": nbytes / median / 1e9,
                    "peer_access": torch.cuda.can_device_access_peer(src, dst),
                }
            )
            del a, b
            torch.cuda.empty_cache()
    return rows


def allreduce_sweep(sizes: list[int] | None = None, iters: int = 20, warmup: int = 5) -> list[dict[str, object]]:
    """All-reduce (sum, float32) bus bandwidth at each message size, over every rank of the running group (NCCL on
    GPUs, one per rank; gloo on CPU ranks). Every rank calls it; every rank returns the same rows."""
    if not distributed.active():
        raise RuntimeError("allreduce_sweep needs a process group of 2+ ranks (torchrun, or all_reduce_ranks)")
    on_gpu = torch.cuda.is_available()
    group = dist.new_group(backend="nccl") if on_gpu else None
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    n = distributed.world_size()
    sizes = sizes or message_sizes(hi=GiB if on_gpu else MiB)
    rows = []
    for nbytes in sizes:
        x = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=device)
        for _ in range(warmup):
            dist.all_reduce(x, group=group)
        _sync(on_gpu)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x, group=group)
        _sync(on_gpu)
        elapsed = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank's time, over the gloo group
        seconds = float(elapsed.item())
        algbw, busbw = bus_bandwidth(x.numel() * 4, seconds, n)
        rows.append({"bytes": x.numel() * 4, "time_us": seconds * 1e6, "algbw_gbps": algbw, "busbw_gbps": busbw})
        del x
    if group is not None:
        dist.destroy_process_group(group)
    return rows


def _sync(on_gpu: bool) -> None:
    if on_gpu:
        torch.cuda.synchronize()


def _allreduce_worker(sizes: list[int] | None, iters: int, warmup: int) -> dict[str, object]:
    with distributed.session():
        return {"ranks": distributed.world_size(), "rows": allreduce_sweep(sizes, iters, warmup)}


def all_reduce_ranks(nproc: int, sizes: list[int] | None = None, iters: int = 20, warmup: int = 5) -> dict:
    """allreduce_sweep in `nproc` fresh processes on this host (torch.distributed's launcher, as torchrun starts them);
    rank 0's answer: {"ranks", "rows"}. On CPU-only hosts the ranks use gloo."""
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=f"fuselab-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        max_restarts=0,
        start_method="spawn",
        monitor_interval=0.1,
    )
    results = elastic_launch(config, _allreduce_worker)(sizes, iters, warmup)
    return results[0]


def measure_interconnect(*, quick: bool = False, nproc: int | None = None) -> dict[str, object]:
    """The host's interconnect ceilings: link types, peer copies (GPUs only) and the all-reduce sweep.

    Under torchrun every rank calls it (the all-reduce runs on the group; rank 0 times the copies while the others
    wait); otherwise the all-reduce runs in `nproc` processes (default: one per GPU) started here."""
    on_gpu = torch.cuda.is_available()
    hi = (64 * MiB if quick else GiB) if on_gpu else MiB
    sizes = message_sizes(hi=hi, factor=4 if quick else 2)
    result: dict[str, object] = {"nccl_nvls_enable": os.environ.setdefault("NCCL_NVLS_ENABLE", "0")}
    if distributed.active():
        result["allreduce"] = {"ranks": distributed.world_size(), "rows": allreduce_sweep(sizes)}
        if distributed.is_main():
            result["topology"] = topology() if on_gpu else None
            result["peer_copy"] = peer_copies(64 * MiB if quick else GiB) if on_gpu else []
        distributed.barrier()
        return result
    result["topology"] = topology() if on_gpu else None
    result["peer_copy"] = peer_copies(64 * MiB if quick else GiB) if on_gpu else []
    result["allreduce"] = all_reduce_ranks(nproc or max(2, torch.cuda.device_count()), sizes)
    result["nccl_version"] = _nccl_version() if on_gpu else None
    return result


def _nccl_version() -> str | None:
    try:
        version = torch.cuda.nccl.version()
    except Exception:  # NCCL not built in
        return None
    return ".".join(map(str, version)) if isinstance(version, tuple | list) else str(version)
