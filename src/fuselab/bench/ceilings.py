"""The device's measured limits: copy bandwidth, matmul rates, launch overhead; cached per device and driver.

Every GB/s and TFLOP/s that fuselab prints is set against these measured ceilings, never the datasheet. Ceilings
measured while the CPU was busy read low, and every rate set against them high: they say so (`busy`, `busy_note`),
and a run more than BUSY_RETRY_S after them measures them again.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from fuselab.bench.env import environment, provenance
from fuselab.bench.timer import CPU_BUSY_FRACTION, Measurement, Timing, benchmark

GPU_COPY_BYTES = 2 * 2**30  # source size; the copy moves twice this (read + write)
CPU_COPY_BYTES = 256 * 2**20
GPU_MATMUL_N = 8192
CPU_MATMUL_N = 1024


def cache_dir() -> Path:
    return Path(os.environ.get("FUSELAB_CACHE", Path.home() / ".cache" / "fuselab")) / "ceilings"


def cache_key(device: str) -> str:
    env = environment(device)
    parts = [env["gpu"] or env["cpu"] or "cpu", env.get("driver") or "", env["torch"]]
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", "-".join(str(p) for p in parts if p)).strip("_")


@contextlib.contextmanager
def matmul_tf32(on: bool) -> Iterator[None]:
    """fp32 matmuls on TF32 tensor cores (on) or not, inside the block; the setting exactly as it was after it.

    Through `fp32_precision` where torch has it (2.9 on): setting the legacy `allow_tf32` and back leaves "ieee" where
    it was "none", which changes Inductor's cache keys (its `cuda_matmul_settings`), so a process that measured its
    ceilings would miss every graph compiled before (`fuselab.evaluate.warm`), and reading `allow_tf32` after a mix of
    the two raises."""
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):
        previous = matmul.fp32_precision
        matmul.fp32_precision = "tf32" if on else "ieee"
        try:
            yield
        finally:
            matmul.fp32_precision = previous
        return
    previous_allowed = matmul.allow_tf32
    matmul.allow_tf32 = on
    try:
        yield
    finally:
        matmul.allow_tf32 = previous_allowed


def measure_ceilings(device: str | None = None, *, quick: bool = False) -> dict[str, object]:
    """Measure the limits of `device` (default: the GPU if any). quick: smaller sizes, for tests and --quick.

    Returns copy_gbps (bytes read + written per second / 1e9), matmul_tflops per dtype (fp32, tf32, bf16;
    random data), launch_us (host time to issue a tiny kernel), tiny_kernel_us (its device time), cpu_busy (on the
    CPU, the largest share of a timing during which some task waited for a CPU; None elsewhere), the environment,
    and how each was measured.
    """
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    on_gpu = torch.device(device).type == "cuda"
    copy_bytes = (GPU_COPY_BYTES if on_gpu else CPU_COPY_BYTES) // (16 if quick else 1)
    n = (GPU_MATMUL_N if on_gpu else CPU_MATMUL_N) // (4 if quick else 1)
    timing = Timing(warmup_ms=50.0 if quick else 300.0, rep_ms=100.0 if quick else 400.0, min_reps=5)

    copy = _time_copy(copy_bytes, device, timing)
    timed = [copy]

    matmul_tflops: dict[str, float] = {}
    matmul_modes = {"fp32": (torch.float32, False), "tf32": (torch.float32, True), "bf16": (torch.bfloat16, False)}
    for name, (dtype, tf32) in matmul_modes.items():
        if name == "tf32" and not on_gpu:
            continue  # tf32 is a GPU tensor-core mode
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        with matmul_tf32(tf32):
            m = benchmark(lambda a=a, b=b: a @ b, label=f"matmul {name}", device=device, timing=timing, flush_l2=False)
            timed.append(m)
        matmul_tflops[name] = 2 * n**3 / (m.median_ms * 1e-3) / 1e12
        del a, b

    tiny = torch.ones(1, device=device)
    launch = benchmark(lambda: tiny.add_(1), label="tiny kernel", device=device, flush_l2=False)
    shares = [m.cpu_busy for m in (*timed, launch) if m.cpu_busy is not None]

    return {
        "key": cache_key(device),
        "env": provenance(device),  # what measured them, and when: the cache keeps them
        "copy_gbps": 2 * copy_bytes / (copy.median_ms * 1e-3) / 1e9,
        "copy": {"bytes_moved": 2 * copy_bytes, **copy.summary()},
        "matmul_tflops": matmul_tflops,
        "matmul_n": n,
        "launch_us": (launch.host_ms or 0.0) * 1e3,
        "tiny_kernel_us": launch.median_ms * 1e3,
        "cpu_busy": max(shares) if shares else None,
        "quick": quick,
    }


def copy_gbps_at(bytes_moved: int, device: str, timing: Timing | None = None) -> float:
    """GB/s of a copy moving `bytes_moved` (half read, half written; `_time_copy`): the copy ceiling at one size.

    Small tensors do not reach the ceiling measured at GPU_COPY_BYTES (launch, ramp-up and the last wave weigh more),
    so a kernel's GB/s is also worth setting against a copy of the same bytes.
    """
    m = _time_copy(max(4, bytes_moved // 2), device, timing)
    return bytes_moved / (m.median_ms * 1e-3) / 1e9


def _time_copy(nbytes: int, device: str, timing: Timing | None) -> Measurement:
    """The faster of two copies of `nbytes` (fp32): torch's copy_ and an elementwise kernel (`neg`) moving the same
    bytes. torch's copy of a contiguous tensor is a memcpy, which a CUDA graph records as a memcpy node: ~2.7 TB/s
    on the H200 where the same copy outside a graph moves ~4.2 (2026-12-03), so timed alone under `cuda_graph` it set
    a same-size ceiling that kernels beat by half."""
    src = torch.rand(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    memcpy = benchmark(lambda: dst.copy_(src), label="copy", device=device, timing=timing)
    kernel = benchmark(lambda: torch.neg(src, out=dst), label="copy (kernel)", device=device, timing=timing)
    return min(memcpy, kernel, key=lambda m: m.median_ms)


BUSY_RETRY_S = 600.0  # ceilings cached busy are used this long (flagged), then measured again


def get_ceilings(device: str | None = None, *, refresh: bool = False, measure: bool = True) -> dict | None:
    """The cached ceilings of `device`, measured (and cached) when missing or when refresh is set.

    Ceilings measured while the CPU was busy (`busy`) are cached as such: the runs of the next BUSY_RETRY_S use them
    (their rows say so), a later run measures again and keeps the less busy of the two (a quiet measurement
    replaces them for good). A full measurement takes a CPU half a minute, so a busy machine does not pay it on
    every run. measure=False returns None instead of measuring when nothing is cached.
    """
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    path = cache_dir() / f"{cache_key(device)}.json"
    cached = json.loads(path.read_text()) if path.exists() else None
    if cached is not None and cached.get("quick"):
        cached = None
    young = cached is not None and time.time() - path.stat().st_mtime < BUSY_RETRY_S
    if cached is not None and not refresh and (not busy(cached) or young or not measure):
        return cached
    if not measure:
        return None
    ceilings = measure_ceilings(device)
    if cached is not None and busy(cached) and busy(ceilings) and not refresh:
        ceilings = min(cached, ceilings, key=_busy_share)  # the less busy of the two
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(ceilings, indent=1))  # written again: the next retry is BUSY_RETRY_S from now
    return ceilings


def _busy_share(ceilings: dict) -> float:
    share = ceilings.get("cpu_busy")
    if share is None:
        share = (ceilings.get("copy") or {}).get("cpu_busy")
    return float(share or 0.0)


def busy(ceilings: dict | None) -> bool:
    """Whether `ceilings` were measured while the CPU was busy: their cpu_busy (an older cache: its copy's) over
    CPU_BUSY_FRACTION. Such ceilings read low, so the rates set against them read high."""
    return bool(ceilings) and _busy_share(ceilings) > CPU_BUSY_FRACTION  # type: ignore[arg-type]


def busy_note(ceilings: dict | None) -> str | None:
    """What a row or table set against busy `ceilings` must say (None where they are not busy)."""
    if not busy(ceilings):
        return None
    return (
        f"the device's ceilings were measured while the CPU was busy (some task waited for a CPU "
        f"{100 * _busy_share(ceilings):.0f}% of the time), so they read low and the % of them high; a run "  # type: ignore[arg-type]
        f"{BUSY_RETRY_S / 60:.0f} minutes after them measures them again (now: fuselab device --refresh)"
    )


def peak_tflops(ceilings: dict | None, dtype: str) -> float | None:
    """The measured matmul TFLOP/s a compute-bound kernel in `dtype` is held against: for float32 tf32's where
    measured (else plain fp32's); for 16-bit dtypes the faster of bf16's (fp16 runs at the bf16 rate on the tensor
    cores) and float32's, since 16-bit data can be multiplied in fp32 (a CPU without bf16 units multiplies bf16 100x
    slower than fp32, and a bf16 kernel computing in fp32 there sat 40x above a bf16 ceiling)."""
    if not ceilings:
        return None
    rates = ceilings.get("matmul_tflops") or {}
    fp32 = rates.get("tf32") or rates.get("fp32")
    if dtype in ("bfloat16", "float16"):
        found = [rate for rate in (rates.get("bf16"), fp32) if rate]
        return max(found) if found else None
    if dtype == "float32":
        return fp32
    return None
