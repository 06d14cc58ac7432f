"""Warm the compile caches before a bench run times: the cases whose first call compiles code, called first in worker
processes.

A bench run over many shapes pays one torch.compile per case of a compiled impl (about 7 s of host time each on the
H200 machine, forward and forward + backward), one after the other; on a GPU, Triton's JIT also compiles a kernel per
case of a Triton impl (ours, Liger-Kernel's: one per specialization, its constexpr plan values and the inputs'
divisibility), which costs more host time than timing the case. `warm_up` runs those compiles first in `jobs` worker
processes (multiprocessing, "spawn"), each taking every jobs-th case (`warm_cases`) and calling it once,
untimed, as the timed run first calls it (`warm_case`: a fresh `WatchedCompile` on inputs of the case's shape,
dtype and layout, then its forward + backward step where that pass is asked). The timed run's compiles then read
Inductor's on-disk caches (the FX graph cache and the AOT autograd cache; on a GPU the Triton kernels come with them)
instead of generating and compiling code, and Triton's JIT finds the kernels in its own on-disk cache. Dynamo still
traces in the timed run (a fraction of a second a case).

Where the caches are: Inductor keeps them under TORCHINDUCTOR_CACHE_DIR, by default <tempdir>/torchinductor_<user>
(`tempfile.gettempdir()`, so TMPDIR counts), and the Triton kernels it compiles under TRITON_CACHE_DIR, by default
<that folder>/triton/<GPU index>. Workers are children of the run: they inherit its environment and so compute the
same folders; nothing has to be set. The run still pins TORCHINDUCTOR_CACHE_DIR to the folder torch resolves (as
torch itself does on first use), so parent and workers cannot disagree, and reports it. Each worker's Inductor
compile pool is given the CPUs divided by the jobs (TORCHINDUCTOR_COMPILE_THREADS, unless set): Inductor leaves that
setting out of its cache keys, so the parent's lookups still hit. What does enter them must match between the run
and its workers: torch's global matmul precision among them (`fuselab.bench.ceilings.matmul_tf32` puts it back
exactly after the ceilings' matmuls; the CLI's `cache_lookups` line says how many graphs the timed run still compiled).

Which cases are warmed (`warms`): those of impls marked `compiled` (`Impl.compiled`) on any device, and on a GPU those
of every impl: a worker's call of an eager impl costs it milliseconds, and whether an impl launches Triton kernels
(its own, or another project's) is not known before its call. On the CPU only compiled impls compile anything. A
case that fails in a worker is a warning (`WarmUpWarning`), never a stop: the timed run meets the same error and
records it as its row. Under torchrun (`fuselab.bench.distributed`) warm-up is refused: the ranks already compile
their shares side by side.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import sys
import time
import warnings
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path

import torch

from fuselab.bench import distributed
from fuselab.bench.dtypes import short_name
from fuselab.bench.log import latest_by_key, load_records
from fuselab.bench.record import Case
from fuselab.bench.shapes import apply_layout, format_shape
from fuselab.bench.sweep import NotRun
from fuselab.evaluate.bench import PASSES, bench_grid, step_call
from fuselab.evaluate.cases import fresh_seed, interpreted, prepare, refuse_if_too_big, sweep_cost
from fuselab.evaluate.selection import Selection
from fuselab.ops.registry import Impl, Op

OpLoader = Callable[[], Op]  # what a worker calls to get the op: picklable (a module-level function or a partial)


class WarmUpWarning(UserWarning):
    """A case that failed while warming (the timed run meets the error again and records it), or a worker lost."""


@dataclass(frozen=True)
class WarmUp:
    """What a warm-up did: `jobs` asked, `workers` started, `cases` handed to them; of those `warmed` (called to the
    end), `skipped` (not run: too big for the free memory), `failed` ((case, error) pairs) and `lost` (a worker died
    before reporting them); `seconds` of wall time; `cache_dir`: Inductor's cache folder parent and workers share."""

    jobs: int
    workers: int = 0
    cases: int = 0
    warmed: int = 0
    skipped: int = 0
    failed: tuple[tuple[str, str], ...] = ()
    lost: int = 0
    seconds: float = 0.0
    cache_dir: str | None = None

    def meta(self) -> dict[str, object]:
        """The results file's record of it (`meta["warm"]`)."""
        return {
            "jobs": self.jobs,
            "workers": self.workers,
            "cases": self.cases,
            "warmed": self.warmed,
            "skipped": self.skipped,
            "failed": len(self.failed),
            "lost": self.lost,
            "seconds": round(self.seconds, 3),
            "cache_dir": self.cache_dir,
        }

    def summary(self) -> str:
        """One line: what was warmed, by how many workers, in how long."""
        if not self.cases:
            return "warm-up: no case to warm (no compiled impl, nor a GPU run; or all done in the log)"
        counts = {"failed": len(self.failed), "skipped": self.skipped, "lost": self.lost}
        others = [f"{n} {what}" for what, n in counts.items() if n]
        rest = f" ({', '.join(others)})" if others else ""
        return (
            f"warm-up: {self.warmed} of {self.cases} cases warmed{rest} by {self.workers} worker"
            f"{'s' if self.workers > 1 else ''} in {self.seconds:.1f} s; caches in {self.cache_dir}"
        )


def done_keys(log: str | Path | None) -> set[str]:
    """Keys of the cases a results log already holds without error (a resumed run does not time them again)."""
    if log is None:
        return set()
    return {key for key, row in latest_by_key(load_records(log)).items() if row.get("error") is None}


def warm_cases(
    op: Op, selection: Selection, passes: Sequence[str] = ("forward",), done: Collection[str] = ()
) -> list[Case]:
    """The cases of a bench run of `selection` (`bench_grid`) worth warming: those of impls that `warms` on the
    selection's device and that the run would call here (available on the device in the dtype, with a backward for
    forward + backward; not interpreted), less those whose keys are in `done` (finished in the log of a resumed
    run)."""
    unknown = [p for p in passes if p not in PASSES]
    if unknown or not passes:
        raise ValueError(f"unknown pass {unknown or passes}; accepted: {', '.join(PASSES)}")
    chosen = selection.resolved(op, "bench")
    device = chosen.device
    cases = []
    for case in bench_grid(op, chosen, passes):
        impl = op.get_impl(case.impl)
        if not warms(impl, device) or case.key in done or interpreted(impl, device):
            continue
        if impl.unavailable(device, case.torch_dtype) or (case.backward and not impl.backward):
            continue
        cases.append(case)
    return cases


def warms(impl: Impl, device: str) -> bool:
    """Whether `impl`'s cases are warmed on `device`: a compiled impl's anywhere (Inductor compiles each case), and
    every impl's on a GPU (Triton's JIT compiles a kernel per specialization of a Triton impl)."""
    return impl.compiled or torch.device(device).type == "cuda"


def warm_case(op: Op, case: Case, device: str) -> None:
    """Call `case` once, untimed, as `bench_case` first calls it: the impl prepared afresh (a new `WatchedCompile` for
    a compiled impl) on fresh inputs of the case's shape, dtype, options and layout, its forward, then for forward +
    backward the timed step (`step_call`). Raises what the call raises; TooBig when the inputs would not fit."""
    impl = op.get_impl(case.impl)
    options = case.option_values
    refuse_if_too_big(op, case.shape, case.torch_dtype, device, options, reference=False)
    made = op.make_inputs(case.shape, case.torch_dtype, device, fresh_seed(), **options)
    inputs = tuple(apply_layout(x, case.layout) for x in made)
    fn = prepare(impl, device)
    out = fn(*inputs, **options)
    del out
    if case.backward:
        step_call(fn, inputs, options, backward=True)()
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def describe(case: Case) -> str:
    """'compile fp32 37x129 approximate=tanh forward+backward': a case in one short phrase."""
    options = " ".join(f"{k}={v}" for k, v in case.options)
    layout = "" if case.layout == "contiguous" else case.layout
    parts = [case.impl, short_name(case.dtype), format_shape(case.shape), options, layout, case.pass_ or ""]
    return " ".join(p for p in parts if p)


@dataclass(frozen=True)
class _Report:
    """A worker's word on its `index`-th case: outcome "warmed", "skipped" or "failed", with why (skipped, failed)."""

    index: int
    outcome: str
    detail: str = ""


def _work(load: OpLoader, cases: list[Case], device: str, conn: Connection) -> None:
    """A worker: warm each case in turn, reporting each as it finishes; a failing case is reported, never raised (an
    op that does not load ends the worker: its cases are lost, one warning)."""
    try:
        op = load()
        for i, case in enumerate(cases):
            try:
                warm_case(op, case, device)
                report = _Report(i, "warmed")
            except NotRun as exc:  # too big for the free memory (the timed run refuses it too), or unavailable
                report = _Report(i, "skipped", _one_line(exc))
            except Exception as exc:
                report = _Report(i, "failed", _one_line(exc))
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                torch.cuda.empty_cache()  # what this case held goes back to the other workers
            conn.send(report)
    finally:
        conn.close()


def _one_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    message = lines[0] if lines else ""
    if isinstance(exc, NotRun):
        return message or type(exc).__name__
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


@dataclass
class _Worker:
    """One worker process, its cases and what it said of them so far."""

    number: int
    process: multiprocessing.process.BaseProcess
    reader: Connection
    cases: list[Case]
    started: float
    reports: dict[int, _Report] = field(default_factory=dict)


def warm_up(
    load: OpLoader,
    cases: Sequence[Case],
    *,
    jobs: int,
    device: str,
    say: Callable[[str], None] | None = None,
) -> WarmUp:
    """Call each of `cases` once (`warm_case`) in `jobs` worker processes ("spawn"), split so that the workers finish
    together (`balanced_batches`); return what they did. load: gives the op, here and in each worker (picklable: a
    module-level function or a functools.partial of one, e.g. partial(get_op, "gelu")). say: where a line goes per
    finished worker (default: stderr). A failing case is a WarmUpWarning naming it, and so is a worker that died (its
    cases left are `lost`);
    neither stops the warm-up. Refused (ValueError) under torchrun with more than one rank."""
    if distributed.active():
        raise ValueError(
            "warm-up workers run beside one process, not under torchrun (--gpus N), where the ranks already compile "
            "their shares side by side: drop --warm-jobs, or run on one GPU with it"
        )
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, got {jobs}")
    say = say or _stderr
    cases = list(cases)
    start = time.perf_counter()
    if not cases:
        return WarmUp(jobs=jobs)
    cache_dir = pin_cache_dir()
    batches = balanced_batches(load(), cases, jobs)
    say(f"warm-up: {len(cases)} cases over {len(batches)} worker process{'es' if len(batches) > 1 else ''}")
    workers = _start(load, batches, device)
    try:
        _collect(workers, say)
    finally:
        for w in workers:  # only on an interruption are any still running
            if w.process.is_alive():
                w.process.terminate()
            w.process.join()
    reports = [(w, r) for w in workers for r in w.reports.values()]
    outcomes = [r.outcome for _, r in reports]
    failed = tuple((describe(w.cases[r.index]), r.detail) for w, r in reports if r.outcome == "failed")
    return WarmUp(
        jobs=jobs,
        workers=len(workers),
        cases=len(cases),
        warmed=outcomes.count("warmed"),
        skipped=outcomes.count("skipped"),
        failed=failed,
        lost=len(cases) - len(outcomes),
        seconds=time.perf_counter() - start,
        cache_dir=cache_dir,
    )


def balanced_batches(op: Op, cases: Sequence[Case], jobs: int) -> list[list[Case]]:
    """`cases` split over min(jobs, len(cases)) workers by estimated seconds, so that they finish together: a compile
    for a compiled impl's case (`sweep_cost`), twice over for forward + backward (a second graph), each case longest
    first to the least-loaded worker (`distributed.split_by_cost`); a worker's cases in their given order. (Dealt in
    turn, k, k + jobs, ..., they lined up with a run's order of impls and passes: 15 workers over a draw of 5 impls
    gave all 1200 compiled cases to 3 of them, 14 workers every forward + backward case to half of them.)"""
    cost = sweep_cost(op)
    costs = [cost(case) * (2 if case.backward else 1) for case in cases]
    parts = distributed.split_by_cost(costs, min(jobs, len(cases)))
    return [[cases[i] for i in part] for part in parts if part]


def pin_cache_dir() -> str | None:
    """Inductor's cache folder, resolved as torch resolves it and set in TORCHINDUCTOR_CACHE_DIR (if unset) so that
    the workers started after it use the very same; None where this torch does not say."""
    try:
        from torch._inductor.runtime.cache_dir_utils import cache_dir
    except ImportError:
        return os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", cache_dir())
    return os.environ["TORCHINDUCTOR_CACHE_DIR"]


def _start(load: OpLoader, batches: list[list[Case]], device: str) -> list[_Worker]:
    """Start one spawned worker per batch, its Inductor compile pool sized to its share of the CPUs."""
    context = multiprocessing.get_context("spawn")
    threads = str(max(1, (os.cpu_count() or 1) // len(batches)))
    workers: list[_Worker] = []
    with _environment(TORCHINDUCTOR_COMPILE_THREADS=threads):
        for number, batch in enumerate(batches, start=1):
            reader, writer = context.Pipe(duplex=False)
            process = context.Process(target=_work, args=(load, batch, device, writer), name=f"fuselab-warm-{number}")
            try:
                process.start()
            except BaseException as exc:
                for w in workers:
                    w.process.terminate()
                    w.process.join()
                if isinstance(exc, (pickle.PicklingError, AttributeError, TypeError)):  # a lambda, a local function
                    raise TypeError(
                        f"the op's loader cannot be sent to a worker process ({_one_line(exc)}); give a module-level "
                        "function or a functools.partial of one"
                    ) from exc
                raise
            finally:
                writer.close()  # the worker holds its end: when it exits, the reader gets EOF
            workers.append(_Worker(number, process, reader, batch, time.perf_counter()))
    return workers


def _collect(workers: list[_Worker], say: Callable[[str], None]) -> None:
    """Read every worker's reports until each has exited; warn of each failure as it comes, and say a line per
    finished worker. A worker is done when its pipe ends or its process has exited (a process it started itself may
    still hold the pipe open): what it sent before is read first."""
    live = {w.number: w for w in workers}
    while live:
        by_handle = {h: w for w in live.values() for h in (w.reader, w.process.sentinel)}
        for handle in wait(list(by_handle)):
            w = by_handle[handle]
            if w.number not in live:
                continue
            ended = handle is not w.reader  # the process's sentinel: it has exited
            while not ended or w.reader.poll():
                try:
                    _note(w, w.reader.recv())
                except EOFError:
                    ended = True
                    break
                if handle is w.reader:
                    break  # one report a wake-up; the next wait sees the rest
            if ended:
                del live[w.number]
                w.process.join()
                say(_finished_line(w, len(workers)))


def _note(w: _Worker, report: _Report) -> None:
    """Keep a worker's report; a failed case is a WarmUpWarning at once."""
    w.reports[report.index] = report
    if report.outcome == "failed":
        warnings.warn(
            f"warm-up: {describe(w.cases[report.index])} failed: {report.detail} (the timed run meets it again and "
            "records it)",
            WarmUpWarning,
            stacklevel=3,
        )


def _finished_line(w: _Worker, workers: int) -> str:
    """'warm-up: worker 2/4 done in 31.2 s: 5 of 6 cases warmed, 1 failed'; a worker that died says so, and warns."""
    counts = [r.outcome for r in w.reports.values()]
    rest = [f"{counts.count(k)} {k}" for k in ("failed", "skipped") if counts.count(k)]
    lost = len(w.cases) - len(counts)
    if lost:
        warnings.warn(
            f"warm-up: worker {w.number} exited (code {w.process.exitcode}) with {lost} of its cases not warmed; the "
            "timed run compiles them itself",
            WarmUpWarning,
            stacklevel=3,
        )
        rest.append(f"{lost} lost")
    seconds = time.perf_counter() - w.started
    tail = f", {', '.join(rest)}" if rest else ""
    warmed = f"{counts.count('warmed')} of {len(w.cases)} cases warmed"
    return f"warm-up: worker {w.number}/{workers} done in {seconds:.1f} s: {warmed}{tail}"


@contextlib.contextmanager
def _environment(**values: str) -> Iterator[None]:
    """Environment variables set (where not already) while processes are started, then as they were."""
    added = [name for name in values if name not in os.environ]
    for name in added:
        os.environ[name] = values[name]
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
