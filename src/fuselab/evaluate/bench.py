"""`bench_op`: how fast, and how far from the limit? The impls of a case timed side by side on one input, one Row a
case through the Sweep, with the derived rates (GB/s, TFLOP/s, % of the ceilings, speed-up against the baseline)."""

from __future__ import annotations

import dataclasses
import functools
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from fuselab.bench import ceilings as ceilings_mod
from fuselab.bench.compiled import WatchedCompile
from fuselab.bench.env import row_provenance
from fuselab.bench.record import Case, Row
from fuselab.bench.shapes import apply_layout, format_shape
from fuselab.bench.sweep import Skipped, Status, Sweep, TooBig, Unavailable
from fuselab.bench.timer import Timing, benchmark_side_by_side, call_cost
from fuselab.evaluate.cases import (
    INTERPRETER_SKIP,
    REFERENCE_TOO_BIG,
    Reference,
    fresh_seed,
    interpreted,
    option_grid,
    prepare,
    refuse_if_nothing_fits,
    refuse_if_too_big,
    sweep_cost,
)
from fuselab.evaluate.selection import Selection
from fuselab.ops.registry import Impl, Op, Shape

PASSES = ("forward", "forward+backward")


def bench_case(
    op: Op,
    impls: Sequence[Impl],
    shape: Shape,
    dtype: torch.dtype,
    device: str,
    options: dict,
    timing: Timing,
    rounds: int = 5,
    backward: bool = False,
    call_cost_ms: float = 100.0,
    layout: str = "contiguous",
) -> dict[str, dict | Exception]:
    """Time the impls of one case on one fresh input, taking turns over `rounds` rounds (`benchmark_side_by_side`;
    CUDA-graph timing runs them one after the other). Per impl: its row (speed, and its error against the reference
    on the same input), or the exception that stopped it. An exception while timing stops them all.

    call_cost_ms: time per impl for `call_cost` (host us/call and end-to-end us/call of back-to-back calls); 0: none.
    backward: time forward + backward (torch.autograd.grad of the output against a fixed random gradient, so nothing
    accumulates); impls without a backward are left out. A compute-bound op on a GPU is also timed back to back
    (`sustained_ms`: calls queued one after another, no flush, as do_bench and the papers time them) beside the
    rested default (each call from an idle, flushed GPU), since clocks under a power limit differ between the two.
    layout: the inputs' memory layout (fuselab.bench.shapes.apply_layout: contiguous, transposed, sliced, expanded).
    """
    results: dict[str, dict | Exception] = {}
    for impl in impls:  # impls that cannot or need not run here are left out before any input is made
        reason = impl.unavailable(device, dtype)
        if not reason and backward and not impl.backward:
            reason = f"{impl.name} has no backward"
        if reason or interpreted(impl, device):
            results[impl.name] = Unavailable(reason) if reason else Skipped(INTERPRETER_SKIP)
    if len(results) == len(impls):
        return results
    inputs = tuple(apply_layout(x, layout) for x in op.make_inputs(shape, dtype, device, fresh_seed(), **options))
    try:
        ref: Reference | None = Reference(op, inputs, options)
    except torch.OutOfMemoryError:  # a float64 reference too large for the device (attention's N x N scores at 16k)
        ref = None
        torch.cuda.empty_cache()
    fns: dict[str, Callable[..., torch.Tensor]] = {}
    for impl in impls:
        if impl.name in results:
            continue
        try:
            fn = prepare(impl, device)
            out = fn(*inputs, **options)
            results[impl.name] = {"rel_err": _error_of(ref, out)}
            del out  # before the next impl's output is made
            if results[impl.name]["rel_err"] is None:
                results[impl.name]["warnings"] = [REFERENCE_TOO_BIG]
            fns[impl.name] = fn
        except Exception as exc:  # this impl fails alone; the others are still timed
            results[impl.name] = exc
            if isinstance(exc, torch.OutOfMemoryError):
                torch.cuda.empty_cache()
    del ref
    calls = {name: step_call(fn, inputs, options, backward) for name, fn in fns.items()}
    try:
        measured = benchmark_side_by_side(calls, rounds=rounds, device=device, timing=timing)
        sustained = (
            back_to_back(calls, device=device, timing=timing)
            if op.bound == "compute" and torch.device(device).type == "cuda"
            else {}
        )
    except Exception as exc:
        return {name: exc if name in fns else result for name, result in results.items()}
    cost_options = {**options, "backward": True} if backward else options
    nbytes, flops = op.case_cost(shape, dtype, cost_options)
    for name, m in measured.items():
        seconds = m.median_ms * 1e-3
        row = results[name]
        notes = row.pop("warnings", [])
        row.update(m.summary(), numel=inputs[0].numel(), bytes=nbytes, flops=flops, bound=op.bound)
        row["warnings"] = [*row["warnings"], *notes]
        if name in sustained:
            row["sustained_ms"] = sustained[name]
            row["sustained_tflops"] = flops / (sustained[name] * 1e-3) / 1e12 if sustained[name] > 0 else None
        row["gbps"] = nbytes / seconds / 1e9 if seconds > 0 else None
        row["tflops"] = flops / seconds / 1e12 if seconds > 0 else None
        fn = fns[name]
        if isinstance(fn, WatchedCompile):
            row.update(compile_s=fn.compile_s, compile_graphs=fn.graphs, compile_flags=fn.flags)
            row["warnings"] = [*row["warnings"], *fn.flags]
        if call_cost_ms > 0:
            row.update(call_cost(calls[name], device=device, budget_ms=call_cost_ms).summary())
    return results


def _error_of(ref: Reference | None, out: torch.Tensor) -> float | None:
    """out's error against the reference; None where the reference does not fit in the device's memory."""
    if ref is None:
        return None
    try:
        return ref.error(out)
    except torch.OutOfMemoryError:  # a piece remade beside the output did not fit
        torch.cuda.empty_cache()
        return None


def step_call(
    fn: Callable[..., torch.Tensor], inputs: Sequence[torch.Tensor], options: dict, backward: bool
) -> Callable[[], object]:
    """What one timed call runs: the forward, or forward + backward (gradients of every floating input against one
    fixed random output gradient, returned rather than accumulated)."""
    if not backward:
        return functools.partial(fn, *inputs, **options)
    leaves = [x.detach().requires_grad_(x.is_floating_point()) for x in inputs]
    wanted = [x for x in leaves if x.requires_grad]
    with torch.no_grad():
        probe = fn(*leaves, **options)
    grad = torch.randn_like(probe)

    def step() -> object:
        return torch.autograd.grad(fn(*leaves, **options), wanted, grad)

    return step


def back_to_back(
    calls: dict[str, Callable[[], object]], *, device: str, timing: Timing, rounds: int = 3
) -> dict[str, float]:
    """{name: median ms per call} of each callable queued back to back (no L2 flush, no idle gap between calls),
    timed with CUDA events over bursts of about timing.rep_ms / rounds, the callables taking turns."""
    samples: dict[str, list[float]] = {name: [] for name in calls}
    per_call: dict[str, float] = {}
    for name, call in calls.items():  # one synced call each, to size the bursts
        torch.cuda.synchronize(device)
        start = time.perf_counter()
        call()
        torch.cuda.synchronize(device)
        per_call[name] = max((time.perf_counter() - start) * 1e3, 1e-3)
    for _ in range(rounds):
        for name, call in calls.items():
            n = max(3, min(200, int(timing.rep_ms / rounds / per_call[name])))
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            call()  # one call ahead, so the burst starts with the GPU busy
            begin.record()
            for _ in range(n):
                call()
            end.record()
            end.synchronize()
            samples[name].append(begin.elapsed_time(end) / n)
    return {name: statistics.median(values) for name, values in samples.items()}


def bench_grid(op: Op, chosen: Selection, passes: Sequence[str] = ("forward",)) -> list[Case]:
    """The cases a bench run of `chosen` (a Selection `resolved` for "bench") times, in the order it times them:
    dtype-major, then shape (in the selection's order), layout, option values, pass, and impl fastest (the impls of a
    case are measured together, and the log is written in that order)."""
    return [
        Case.of(op.name, name, dtype, shape, opts, layout=layout, pass_=pass_)
        for dtype in chosen.dtypes
        for shape in chosen.shapes
        for layout in chosen.layouts
        for opts in option_grid(op, chosen.options)
        for pass_ in passes
        for name in chosen.impls
    ]


def bench_op(
    op: Op,
    selection: Selection | None = None,
    *,
    out: str | Path | None = None,
    timing: Timing | dict | None = None,
    rounds: int = 5,
    show_progress: bool = True,
    passes: Sequence[str] = ("forward",),
    call_cost_ms: float = 100.0,
    max_call_ms: float | None = None,
    slow_before: Sequence[Row] = (),
    refuse_early: bool = False,
) -> list[Row]:
    """Sweep the selection's impls x dtypes x shapes (x option values) x passes, one Row per case, appended to `out`
    (JSON lines). selection: what to time (None: everything, `Selection.resolved` fills what it leaves out).

    The impls of one case are timed together on the same input, taking turns over `rounds` rounds, so the ratios
    between them are not at the mercy of what drifts (clocks under a power limit, temperature). A resumed sweep times
    only the impls its log lacks (their ratios are then against rows timed in the earlier run). Rows carry the
    environment, median/IQR (ms), GB/s, TFLOP/s, % of the measured copy ceiling and of a copy of the same bytes timed
    after the sweep, the speed-up against the op's baseline impl, and the error against the reference.
    timing: how each impl is timed (a `fuselab.bench.Timing`, or a mapping of its fields; None: its defaults).
    passes: "forward" and/or "forward+backward" (each case's `pass`; the cost model is asked for the backward's
    bytes and FLOPs with backward=True).
    call_cost_ms > 0 adds the host's cost of a call and the end-to-end time of back-to-back calls (host_us, e2e_us).
    The selection's layouts are the inputs' memory layouts (`bench_case`), each case timed in each; rows of a layout
    other than contiguous carry it.
    max_call_ms: an impl whose median call took longer at one case is not timed at the sweep's costlier cases of the
    same dtype, options and pass (`CallCap`): their rows are skipped, saying why (None: every case is timed).
    slow_before: rows of earlier sweeps (of the same op) whose slow calls keep their impls out of this sweep's
    costlier cases too, as a resumed sweep's own log does.
    refuse_early: when no case fits in the device's free memory, raise TooBig (`refuse_if_nothing_fits`) before any
    work (nothing logged) instead of returning refused rows.
    """
    timing = Timing.of(timing)
    unknown = [p for p in passes if p not in PASSES]
    if unknown or not passes:
        raise ValueError(f"unknown pass {unknown or passes}; accepted: {', '.join(PASSES)}")
    chosen = (selection or Selection()).resolved(op, "bench")
    names, dtypes, options, device = chosen.impls, chosen.dtypes, chosen.options, chosen.device
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    if refuse_early:
        refuse_if_nothing_fits(op, chosen.shapes, dtypes, device, option_grid(op, options), True)
    cap = CallCap(op, max_call_ms)
    shapes = cap.cheapest_first(chosen.shapes, dtypes[0], op.resolve_options(options))
    cases = bench_grid(op, dataclasses.replace(chosen, shapes=shapes), passes)
    ceilings = ceilings_mod.get_ceilings(device)
    copy_gbps = ceilings["copy_gbps"] if ceilings else None
    measured: dict[str, dict[str, dict | Exception]] = {}  # one case's impls, timed together at its first impl
    finished: set[str] = set()  # cases of the log, not timed again on resume

    def run(case: Case) -> dict:
        together = case.peer_key
        if together not in measured:
            try:
                refuse_if_too_big(op, case.shape, case.torch_dtype, device, case.option_values, pieces=True)
            except TooBig as exc:
                measured[together] = dict.fromkeys(names, exc)
                raise
            capped = {n: cap.reason(case.with_impl(n)) for n in names}
            measured[together] = {n: Skipped(why) for n, why in capped.items() if why}
            pending = [n for n in names if not capped[n] and case.with_impl(n).key not in finished]
            measured[together] |= bench_case(
                op,
                [op.get_impl(n) for n in pending],
                case.shape,
                case.torch_dtype,
                device,
                case.option_values,
                timing,
                rounds,
                backward=case.backward,
                call_cost_ms=call_cost_ms,
                layout=case.layout,
            )
            for name, result in measured[together].items():
                if isinstance(result, dict):
                    cap.note(Row.from_json({**case.with_impl(name).to_json(), **result}, op.options))
        result = measured[together][case.impl]
        if isinstance(result, Exception):
            raise result
        return {**result, **row_provenance(device)}

    spread = {"cost": sweep_cost(op, timing), "group": lambda case: case.peer_key}  # over GPUs under torchrun
    with Sweep(cases, out, description=f"bench {op.name}", show_progress=show_progress, **spread) as sweep:
        logged = [Row.from_json(r, op.options) for r in sweep.done.values()]
        for row in [*slow_before, *logged]:  # an earlier sweep's or a resumed sweep's slow impls stay out
            cap.note(row)
        finished.update(row.case.key for row in logged)
        for case in sweep:
            with sweep.running(case) as outcome:
                outcome.update(run(case))
    typed = [Row.from_json(r, op.options) for r in sweep.rows]
    same_size = {}
    if op.bound == "memory":  # a copy of the same bytes, timed once per size: what such a size can reach
        sizes = sorted({r.bytes for r in typed if r.measured and r.bytes})
        same_size = {b: ceilings_mod.copy_gbps_at(b, device, timing) for b in sizes}
    typed = add_derived(typed, op.defaults.baseline, copy_gbps, same_size)
    rows = [with_peak(r, ceilings) for r in typed]
    busy = ceilings_mod.busy_note(ceilings)
    if busy:  # ceilings timed beside other work: every % of them reads high
        rows = [r.updated(warnings=(*r.warnings, busy)) if r.measured else r for r in rows]
    return rows


def with_peak(row: Row, ceilings: dict | None) -> Row:
    """The row with pct_peak: its TFLOP/s as % of the measured matmul rate of its dtype; past ABOVE_CEILING_PCT of
    it, a warning saying so (a compute-bound op's; a memory-bound op's FLOPs are not held to the peak)."""
    peak = ceilings_mod.peak_tflops(ceilings, row.case.dtype)
    if not row.measured or not peak or row.tflops is None:
        return row
    row = row.updated(pct_peak=100 * row.tflops / peak)
    if "pct_peak" in past_ceilings(row):
        row = row.updated(warnings=(*row.warnings, ceiling_warning(row.pct_peak, "pct_peak")))
    return row


class CallCap:
    """A sweep's bound on time: an impl whose median call took longer than `max_ms` at one case is not timed at the
    sweep's cases of the same op, dtype, layout, options and pass that cost more (FLOPs for a compute-bound op, bytes
    moved for a memory-bound one): a teaching impl (a Python loop over blocks) would only take longer there, and
    one sweep's time stays bounded whatever the impls. max_ms None: no bound."""

    def __init__(self, op: Op, max_ms: float | None) -> None:
        self.op, self.max_ms = op, max_ms
        self.over: dict[tuple[str, str], tuple[float, float, list[int]]] = {}  # (impl, kind): (cost, ms, shape)

    def _kind(self, case: Case) -> str:
        return dataclasses.replace(case, impl="", shape=()).key  # the same op, dtype, layout, options and pass

    def _cost(self, case: Case) -> float:
        nbytes, flops = self.op.case_cost(case.shape, case.torch_dtype, case.option_values)
        return float(flops if self.op.bound == "compute" else nbytes)

    def cheapest_first(self, shapes: Sequence[Shape], dtype: torch.dtype, options: dict) -> list[Shape]:
        """`shapes` in the order to time them: as given without a bound; with one, cheapest first (at `dtype` and
        `options`; ties keep their order), so an impl's slow call is met at the smallest case it can be."""
        if self.max_ms is None:
            return list(shapes)

        def cost(shape: Shape) -> float:
            try:
                return self._cost(Case.of(self.op.name, "", dtype, shape, options))
            except Exception:  # a shape the cost model refuses is refused, with the reason, when its turn comes
                return 0.0

        return sorted(shapes, key=cost)

    def note(self, row: Row) -> None:
        """Remember a measured row whose call took over the bound."""
        ms = row.median_ms
        if self.max_ms is None or row.status is not Status.OK or not isinstance(ms, float) or ms <= self.max_ms:
            return
        key, cost = (row.case.impl, self._kind(row.case)), self._cost(row.case)
        if key not in self.over or cost < self.over[key][0]:
            self.over[key] = (cost, ms, list(row.case.shape))

    def reason(self, case: Case) -> str | None:
        """Why `case` is not timed (None: it is)."""
        seen = self.over.get((case.impl, self._kind(case)))
        if seen is None or self._cost(case) <= seen[0]:
            return None
        _, ms, shape = seen
        return (f"not timed: {ms:.0f} ms a call already at {format_shape(tuple(shape))}, a smaller case, over the "
                f"{self.max_ms:g} ms a call this sweep allows")  # fmt: skip


ABOVE_CEILING_PCT = 110.0  # a rate past this % of a ceiling (copy, a copy of the same size, the matmul peak): flagged


ABOVE_CEILING_NOTE = (
    "the copy ceiling: faster than memory allows, so the data stayed in a cache (a small size, or inputs reused) or "
    "the time is wrong"
)


ABOVE_PEAK_NOTE = (
    "the matmul ceiling: faster than this device multiplies in its dtype, so the ceiling was measured low (a busy "
    "CPU, a cold clock) or the time or the FLOP count is wrong"
)


CEILING_SHARES = {"pct_copy": ABOVE_CEILING_NOTE, "pct_copy_same": ABOVE_CEILING_NOTE, "pct_peak": ABOVE_PEAK_NOTE}


def past_ceilings(row: Row) -> dict[str, float]:
    """{field: %} of the row's shares of a ceiling that pass ABOVE_CEILING_PCT: pct_copy and pct_copy_same, and a
    compute-bound row's pct_peak (a memory-bound op's FLOPs are not held to the matmul peak)."""
    shares = {"pct_copy": row.pct_copy, "pct_copy_same": row.pct_copy_same}
    shares["pct_peak"] = row.pct_peak if row.bound == "compute" else None
    return {name: pct for name, pct in shares.items() if pct is not None and pct > ABOVE_CEILING_PCT}


def above_ceiling(row: Row) -> tuple[float, str] | None:
    """(%, field) of the row's largest share of a ceiling where it passes ABOVE_CEILING_PCT, else None."""
    past = past_ceilings(row)
    if not past:
        return None
    name = max(past, key=past.__getitem__)
    return past[name], name


def ceiling_warning(pct: float, share: str) -> str:
    """What a row's warnings say of its share `share` (a CEILING_SHARES field) at `pct` % of its ceiling."""
    return f"{pct:.0f}% of {CEILING_SHARES[share]}"


def add_derived(
    rows: Sequence[Row],
    baseline: str,
    copy_gbps: float | None,
    same_size_copy: dict[int, float] | None = None,
) -> list[Row]:
    """The rows with pct_copy (GB/s as % of the copy ceiling), speedup against `baseline` (its median / this median
    on the same case) and, given same_size_copy ({bytes moved: GB/s of a copy moving as many}), copy_same_gbps and
    pct_copy_same. A row past ABOVE_CEILING_PCT of either gets a warning saying so."""
    base = {r.case.peer_key: r.median_ms for r in rows if r.case.impl == baseline and r.measured}
    out = []
    for row in rows:
        if not row.measured:
            out.append(row)
            continue
        same = (same_size_copy or {}).get(row.bytes) if row.bytes else None
        row = row.updated(
            pct_copy=100 * row.gbps / copy_gbps if copy_gbps and row.gbps else None,
            copy_same_gbps=same,
            pct_copy_same=100 * row.gbps / same if same and row.gbps else None,
        )
        copy = {name: pct for name, pct in past_ceilings(row).items() if name != "pct_peak"}  # the peak: with_peak
        if copy:
            row = row.updated(warnings=(*row.warnings, ceiling_warning(max(copy.values()), "pct_copy")))
        reference_ms = base.get(row.case.peer_key)
        out.append(row.updated(baseline=baseline, speedup=reference_ms / row.median_ms if reference_ms else None))
    return out
