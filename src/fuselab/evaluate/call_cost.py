"""The cost of one call: shapes from tiny to large, the host's and the end-to-end time per call beside the device's,
under torch.compile too, and the size from which the GPU, not the host, sets the time."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from fuselab.bench.dtypes import dtype_name
from fuselab.bench.record import Row
from fuselab.bench.shapes import size_ladder
from fuselab.bench.sweep import Status
from fuselab.bench.timer import Timing, benchmark, call_cost
from fuselab.evaluate.cases import fresh_seed
from fuselab.ops.registry import Op, Shape

GPU_BOUND_FACTOR = 1.2  # end to end per call within this factor of the device time: the GPU, not the host, sets it


GROWTH_FACTOR = 2.0  # on the CPU: time per call at least this many times the smallest size's: the work, not the call


def ladder_shapes(
    op: Op,
    *,
    min_bytes: float,
    max_bytes: float,
    factor: float = 4.0,
    max_flops: float | None = None,
    dtype: torch.dtype = torch.float32,
    options: dict | None = None,
) -> list[Shape]:
    """Shapes from tiny to large for the cost of a call: the op's profile shape grown or shrunk (`size_ladder`) so it
    moves min_bytes, min_bytes * factor, ... up to max_bytes (the op's cost model), those above max_flops left out."""
    opts = op.resolve_options(options)

    def nbytes(shape: Shape) -> float:
        return op.case_cost(shape, dtype, opts)[0]

    shapes = size_ladder(op.default_profile_shape(), nbytes, min_bytes, max_bytes, factor)
    return [s for s in shapes if max_flops is None or op.case_cost(s, dtype, opts)[1] <= max_flops]


def call_cost_row(row: Row) -> dict:
    """A bench row (bench_op with call_cost_ms > 0) as a cost-of-a-call row: device time per call in us beside the
    host's and the end-to-end time of back-to-back calls."""
    out = {
        "op": row.case.op,
        "impl": row.case.impl,
        "dtype": row.case.dtype,
        "shape": list(row.case.shape),
        **{k: row.field(k) for k in ("numel", "bytes", "flops", "host_us", "e2e_us", "host_bound", "error")},
    }
    out["mode"] = "eager"
    out["device_us"] = row.median_ms * 1e3 if row.median_ms is not None else None
    if row.error:
        out["status"] = str(row.status)
    return out


def compiled_call_cost(
    op: Op,
    impl_name: str,
    mode: str,
    shapes: Sequence[Shape],
    *,
    dtype: torch.dtype,
    device: str,
    options: dict | None = None,
    timing: Timing | None = None,
    budget_ms: float = 50.0,
) -> list[dict]:
    """The cost of a call of `impl_name` under torch.compile(mode=mode, dynamic=True) (one compile for every shape;
    "reduce-overhead" captures a CUDA graph per shape), one row per shape as `call_cost_row`: device time
    (`benchmark`), host and end-to-end us per call (`call_cost`), or the error that stopped it."""
    impl = op.get_impl(impl_name)
    opts = op.resolve_options(options)
    reason = impl.unavailable(device) or (
        "compiled already: torch.compile of it is its own impl" if impl.compiled else ""
    )
    torch._dynamo.reset()
    fn = torch.compile(lambda *xs: impl.fn(*xs, **opts), mode=mode, dynamic=True)
    rows = []
    for shape in shapes:
        nbytes, flops = op.case_cost(shape, dtype, opts)
        row = {"op": op.name, "impl": impl_name, "mode": mode, "dtype": dtype_name(dtype), "shape": list(shape)}
        row.update(bytes=nbytes, flops=flops, numel=None, device_us=None, host_us=None, e2e_us=None, error=None)
        if reason:
            rows.append({**row, "error": reason, "status": Status.UNAVAILABLE.value})
            continue
        try:
            inputs = op.make_inputs(shape, dtype, device, fresh_seed(), **opts)
            call = functools.partial(fn, *inputs)
            with torch.no_grad():  # forward only, as the eager rows (no input asks for a gradient)
                call()  # compiles (once; reduce-overhead records a graph per shape)
                measured = benchmark(call, device=device, timing=timing)
                cost = call_cost(call, device=device, budget_ms=budget_ms)
            row.update(numel=inputs[0].numel(), device_us=measured.median_ms * 1e3, **cost.summary())
        except Exception as exc:  # this mode fails at this size alone; the rest go on
            row.update(error=f"{type(exc).__name__}: {exc}"[:500], status=Status.ERROR.value)
            if isinstance(exc, torch.OutOfMemoryError):
                torch.cuda.empty_cache()
        rows.append(row)
    torch._dynamo.reset()
    return rows


def bound_from(rows: Sequence[dict], on_gpu: bool) -> dict | None:
    """Of one impl's rows (one mode, sizes ascending by bytes): the first from which every larger one is
    - on a GPU, GPU-bound: end to end per call within GPU_BOUND_FACTOR of the device time;
    - on the CPU, growing: end to end per call at least GROWTH_FACTOR times the smallest size's (the fixed cost of a
      call no longer most of it).
    {"shape", "bytes", "numel"} of that row, or None when the largest size is not so (or nothing was timed)."""
    timed = sorted((r for r in rows if not r.get("error") and r.get("e2e_us")), key=lambda r: r["bytes"])
    if not timed:
        return None
    floor = min(r["e2e_us"] for r in timed)

    def holds(r: dict) -> bool:
        if on_gpu:
            return r.get("device_us") is not None and r["e2e_us"] <= GPU_BOUND_FACTOR * r["device_us"]
        return r["e2e_us"] >= GROWTH_FACTOR * floor

    first = None
    for r in reversed(timed):
        if not holds(r):
            break
        first = r
    return None if first is None else {"shape": first["shape"], "bytes": first["bytes"], "numel": first.get("numel")}
