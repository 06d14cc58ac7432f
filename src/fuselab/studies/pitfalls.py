"""Benchmarking done wrong and right: one kernel timed without warm-up, without synchronize, and correctly.

Without warm-up the first call's one-time costs (compilation, autotuning, library set-up, clocks still ramping)
land in the average. Without synchronize the host clock stops when the launch returns, long before the GPU is
done: it times the launch, not the kernel. The harness's `pitfall` modes do both on purpose; this study sets
them beside the correct measurement and gives the ratios.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from fuselab.bench.timer import Timing, benchmark

Maker = Callable[[], Callable[[], object]]  # builds a fresh callable, so that its first call is a cold one


def time_three_ways(make: Maker, *, label: str, device: str, timing: Timing | None = None, reps: int = 10) -> dict:
    """Time a fresh `make()` from its first call (no warm-up), without synchronize, and correctly.

    Returns milliseconds: first_call_ms (the very first call, synced), no_warmup_ms (the mean of the first
    `reps` calls, as a loop without warm-up reports it), no_sync_ms (median host time of a call, unsynced),
    correct_ms (the harness: warm-up, sync, events; median), and ratios against correct_ms:
    first_call_ratio, no_warmup_ratio (> 1: over-reports) and no_sync_underreport = correct / no_sync
    (> 1: under-reports).
    """
    fn = make()
    cold = benchmark(fn, label=label, device=device, pitfall="no_warmup", min_reps=reps)
    unsynced = benchmark(fn, label=label, device=device, pitfall="no_sync", min_reps=reps)
    right = benchmark(fn, label=label, device=device, timing=timing)
    correct = right.median_ms
    return {
        "label": label,
        "device": device,
        "first_call_ms": cold.samples_ms[0],
        "no_warmup_ms": cold.mean_ms,
        "no_sync_ms": unsynced.median_ms,
        "correct_ms": correct,
        "correct_iqr_ms": right.iqr_ms,
        "correct_mode": right.mode,
        "first_call_ratio": cold.samples_ms[0] / correct,
        "no_warmup_ratio": cold.mean_ms / correct,
        "no_sync_underreport": correct / unsynced.median_ms if unsynced.median_ms > 0 else None,
        "synchronous_device": torch.device(device).type != "cuda",
    }


def matmul_maker(n: int, dtype: torch.dtype, device: str) -> Maker:
    """A fresh n x n matmul (its inputs made here, so the first call meets a cold library and clocks)."""

    def make() -> Callable[[], object]:
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        return lambda: a @ b

    return make


def op_maker(op_name: str, impl_name: str, shape: tuple[int, ...], dtype: torch.dtype, device: str) -> Maker:
    """A registered op's impl on fresh inputs; a compiled impl is compiled anew, so its first call compiles."""

    def make() -> Callable[[], object]:
        from fuselab.evaluate import fresh_seed, prepare
        from fuselab.ops.registry import get_op

        op = get_op(op_name)
        fn = prepare(op.get_impl(impl_name), device)
        options = op.default_options()
        inputs = op.make_inputs(shape, dtype, device, fresh_seed(), **options)
        return lambda: fn(*inputs, **options)

    return make
