"""Why does fuselab's timer read the bf16 matmul faster than do_bench and torch.profiler do?

The 8192^3 bf16 matmul runs at the H200's power limit. fuselab times each call after a reading L2 flush and a short
spin kernel (which keeps host launch latency out of the sample); do_bench after zeroing 256 MB; the profiler reads
back-to-back calls. This script times the matmul under each condition, all taking turns over ROUNDS rounds, and reads
the SM clock (NVML, where torch can reach it) after each, so the cause shows in one table.
Run on a GPU:  PYTHONPATH=src python3 benchmarks/timer_conditions.py --out benchmarks/results/h200/timer_conditions.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from fuselab.bench import benchmark, environment
from fuselab.bench import timer as timer_mod

ROUNDS = 3
REP_MS = 300.0


def sm_clock_mhz() -> int | None:
    try:
        return int(torch.cuda.clock_rate())
    except Exception:  # no NVML here
        return None


def back_to_back_ms(fn, iters: int = 100) -> float:
    """Mean time of `iters` calls launched back to back, between two events (the profiler's condition)."""
    for _ in range(5):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    import triton.testing

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)

    def matmul() -> torch.Tensor:
        return a @ b

    spin = timer_mod._spin_cycles_per_ms

    def fuselab_no_cover() -> float:
        timer_mod._spin_cycles_per_ms = lambda: 0.0
        try:
            return benchmark(matmul, rep_ms=REP_MS).median_ms
        finally:
            timer_mod._spin_cycles_per_ms = spin

    conditions = {
        "fuselab (reading flush, spin cover)": lambda: benchmark(matmul, rep_ms=REP_MS).median_ms,
        "fuselab without L2 flush": lambda: benchmark(matmul, rep_ms=REP_MS, flush_l2=False).median_ms,
        "fuselab without spin cover": fuselab_no_cover,
        "do_bench (zeroing flush)": lambda: triton.testing.do_bench(matmul, rep=REP_MS, return_mode="median"),
        "back to back (events around 100 calls)": lambda: back_to_back_ms(matmul),
    }
    seen: dict[str, list[dict]] = {name: [] for name in conditions}
    for _ in range(ROUNDS):
        for name, measure in conditions.items():
            ms = measure()
            seen[name].append({"ms": ms, "sm_clock_mhz_after": sm_clock_mhz()})
    rows = []
    for name, rounds in seen.items():
        ms = statistics.median(r["ms"] for r in rounds)
        row = {"condition": name, "median_ms": ms, "tflops": 2 * 8192**3 / ms / 1e9, "rounds": rounds}
        rows.append(row)
        clocks = [r["sm_clock_mhz_after"] for r in rounds]
        print(f"{name:42s} {ms:8.4f} ms  {row['tflops']:6.0f} TFLOP/s  SM clock after: {clocks}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"env": environment("cuda"), "rounds": ROUNDS, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
