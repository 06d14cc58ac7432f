"""Timing a callable correctly on the GPU (or the CPU): `benchmark(fn) -> Measurement`, and several callables that
are to be compared, taking turns: `benchmark_side_by_side({name: fn}) -> {name: Measurement}`. How long to warm up
and repeat, whether to flush L2 or replay a CUDA graph: one `Timing` (a frozen dataclass) that travels whole through
the layers above (bench_op, the report's budgets, the CLI); its fields may also be given as keywords.

On CUDA: warm-up (by count and by time, so clocks ramp and compilation happens before timing), synchronize,
then per repetition an L2 flush (outside the timed region; it reads, so it leaves no dirty lines for the timed call
to write back) followed by CUDA events around the call. On the
CPU the same API times with perf_counter. A CUDA-graph mode removes launch gaps for tiny kernels; the
`pitfall` modes time the wrong ways on purpose, so a study can show how wrong they are.
A kernel bound by the card's power limit (a large bf16 matmul) runs at a higher clock here than back to back: the
flush and the spin let it rest between calls (`fuselab timers conditions`); its sustained rate is the lower one.
"""

from __future__ import annotations

import functools
import os
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Literal

import torch

from fuselab.bench import distributed

Pitfall = Literal["no_warmup", "no_sync"]
PITFALLS: tuple[str, ...] = ("no_warmup", "no_sync")

NOISY_IQR_FRACTION = 0.1  # warn when IQR / median exceeds this, as torch.utils.benchmark does
CPU_BUSY_FRACTION = 0.1  # warn when, for more than this share of a CPU timing, some task waited for a CPU


@dataclass(frozen=True)
class Timing:
    """How to time a callable.

    warmup_ms / min_warmup: warm up for at least this long (ms) and this many calls (clocks ramp, code compiles).
    rep_ms / min_reps / max_reps: repeat for about rep_ms (ms), within these counts.
    flush_l2: evict L2 before each repetition, outside the timed region (CUDA only).
    cuda_graph: capture GRAPH_CALLS calls in a CUDA graph and time its replays (launch-bound kernels; no L2 flush;
        CUDA only: noted and ignored on the CPU).
    """

    warmup_ms: float = 200.0
    min_warmup: int = 3
    rep_ms: float = 500.0
    min_reps: int = 10
    max_reps: int = 1000
    flush_l2: bool = True
    cuda_graph: bool = False

    def __post_init__(self) -> None:
        for name in ("warmup_ms", "rep_ms"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ValueError(f"timing: {name} must be a number of milliseconds >= 0, got {value!r}")
        for name, least in (("min_warmup", 0), ("min_reps", 1), ("max_reps", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"timing: {name} must be an integer >= {least}, got {value!r}")
        if self.max_reps < self.min_reps:
            raise ValueError(f"timing: max_reps ({self.max_reps}) is below min_reps ({self.min_reps})")
        for name in ("flush_l2", "cuda_graph"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"timing: {name} must be True or False, got {getattr(self, name)!r}")

    @classmethod
    def of(cls, timing: Timing | Mapping[str, object] | None = None, **changes: object) -> Timing:
        """`timing` (a Timing, a mapping of its fields such as a JSON budget, or None: the defaults) with `changes`;
        an unknown field is a TypeError naming the known ones."""
        base = timing if isinstance(timing, Timing) else cls(**_fields_of(dict(timing or {})))
        return replace(base, **_fields_of(changes)) if changes else base

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def _fields_of(given: dict[str, object]) -> dict[str, object]:
    known = [f.name for f in fields(Timing)]
    unknown = [k for k in given if k not in known]
    if unknown:
        raise TypeError(f"unknown timing option(s) {', '.join(unknown)}; known: {', '.join(known)}")
    return given


@dataclass
class Measurement:
    """Times of repeated calls, in milliseconds, and what they were measured with.

    samples_ms: every repetition's time. host_ms: median host-side time for one call to return (the host's
    dispatch cost; on the GPU the call is still running then). rounds: how many turns the repetitions were taken in,
    alternating with the callables compared against (1: all at once).
    mode: "events", "cuda_graph", "perf_counter" or a pitfall name.
    cpu_busy: on the CPU, the share of the warm-up and timing during which some task waited for a CPU
    (`CpuPressure`: Linux's /proc/pressure/cpu, else this process's threads' schedstat; None where neither can be
    read): over CPU_BUSY_FRACTION, other work took the CPU and the times are inflated however steady they look.
    cpu_busy_source: where cpu_busy was read.
    """

    samples_ms: list[float]
    mode: str
    device: str
    label: str = ""
    host_ms: float | None = None
    flushed_l2: bool = False
    rounds: int = 1
    notes: list[str] = field(default_factory=list)
    cpu_busy: float | None = None
    cpu_busy_source: str | None = None

    def __post_init__(self) -> None:
        if not self.samples_ms:
            raise ValueError("a Measurement needs at least one sample")

    @property
    def n(self) -> int:
        return len(self.samples_ms)

    @property
    def median_ms(self) -> float:
        return statistics.median(self.samples_ms)

    @property
    def mean_ms(self) -> float:
        return statistics.fmean(self.samples_ms)

    @property
    def min_ms(self) -> float:
        return min(self.samples_ms)

    @property
    def max_ms(self) -> float:
        return max(self.samples_ms)

    def quantile_ms(self, q: float) -> float:
        """Linear-interpolated quantile, q in [0, 1]."""
        s = sorted(self.samples_ms)
        pos = q * (len(s) - 1)
        lo = int(pos)
        hi = min(lo + 1, len(s) - 1)
        return s[lo] + (s[hi] - s[lo]) * (pos - lo)

    @property
    def iqr_ms(self) -> float:
        return self.quantile_ms(0.75) - self.quantile_ms(0.25)

    @property
    def warnings(self) -> list[str]:
        out = list(self.notes)
        if self.n < 5:
            out.append(f"only {self.n} sample(s): the statistics are rough")
        if self.median_ms > 0 and self.iqr_ms / self.median_ms > NOISY_IQR_FRACTION:
            out.append(
                f"IQR is {100 * self.iqr_ms / self.median_ms:.0f}% of the median: noisy; "
                "close other work, repeat longer, or use cuda_graph for tiny kernels"
            )
        if self.busy:
            out.append(
                f"the CPU was busy: for {100 * self.cpu_busy:.0f}% of the timing some task waited for a CPU "
                f"({self.cpu_busy_source or '/proc/pressure/cpu'}), so these times are inflated; rerun on a quieter "
                "machine"
            )
        if self.mode in PITFALLS:
            out.append(f"measured with pitfall {self.mode!r} on purpose: this number is wrong")
        return out

    @property
    def busy(self) -> bool:
        """Whether other work took the CPU while this was timed (cpu_busy over CPU_BUSY_FRACTION)."""
        return self.cpu_busy is not None and self.cpu_busy > CPU_BUSY_FRACTION

    def summary(self) -> dict[str, object]:
        """The statistics without the samples (for tables and result rows)."""
        return {
            "cpu_busy": self.cpu_busy,
            "median_ms": self.median_ms,
            "mean_ms": self.mean_ms,
            "min_ms": self.min_ms,
            "max_ms": self.max_ms,
            "iqr_ms": self.iqr_ms,
            "n": self.n,
            "mode": self.mode,
            "host_ms": self.host_ms,
            "flushed_l2": self.flushed_l2,
            "l2_flush": L2Flusher.METHOD if self.flushed_l2 else None,
            "rounds": self.rounds,
            "warnings": self.warnings,
        }

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), **self.summary()}

    @property
    def noisy(self) -> bool:
        """IQR / median over NOISY_IQR_FRACTION: the median is not to be trusted to better than that."""
        return is_noisy(self.median_ms, self.iqr_ms)

    def __repr__(self) -> str:
        return (
            f"Measurement(label={self.label!r}, median={_fmt(self.median_ms)}, IQR={_fmt(self.iqr_ms)}, n={self.n}, "
            f"mode={self.mode!r}, device={self.device!r})"
        )

    def __str__(self) -> str:
        text = f"{self.label or 'fn'}: median {_fmt(self.median_ms)} (IQR {_fmt(self.iqr_ms)}, {self.n} runs"
        text += f", {self.mode})"
        if self.host_ms is not None:
            text += f"; host returns after {_fmt(self.host_ms)}"
        return "\n  ! ".join([text, *self.warnings])


def is_noisy(median_ms: float | None, iqr_ms: float | None) -> bool:
    """Whether a measurement with this median and IQR is noisy (IQR over NOISY_IQR_FRACTION of the median)."""
    return bool(median_ms and iqr_ms is not None and median_ms > 0 and iqr_ms / median_ms > NOISY_IQR_FRACTION)


class Measurements(dict[str, Measurement]):
    """What benchmark_side_by_side returns: {name: Measurement}, printed as a table (median, IQR, runs, against
    the fastest); '~' marks a noisy median."""

    def table(self) -> str:
        if not self:
            return "Measurements()"
        fastest = min(m.median_ms for m in self.values())
        width = max(len("name"), *(len(name) for name in self))
        lines = [f"{'name':<{width}}  {'median':>11}  {'IQR':>10}  {'runs':>5}  {'x fastest':>9}"]
        for name, m in self.items():
            mark = "~" if m.noisy else " "
            ratio = m.median_ms / fastest if fastest > 0 else float("nan")
            lines.append(
                f"{name:<{width}}  {_fmt(m.median_ms):>10}{mark}  {_fmt(m.iqr_ms):>10}  {m.n:>5}  {ratio:>9.3f}"
            )
        if any(m.noisy for m in self.values()):
            lines.append(f"~ noisy: IQR over {100 * NOISY_IQR_FRACTION:.0f}% of the median")
        return "\n".join(lines)

    __str__ = table

    def __repr__(self) -> str:
        return self.table()


def _fmt(ms: float) -> str:
    return f"{ms * 1000:.2f} us" if ms < 1 else f"{ms:.3f} ms"


class L2Flusher:
    """Evicts the L2 before a repetition by reading a buffer twice its size (one kernel, ~30 us on an H200).

    Reading, not writing: a flush that writes (triton's do_bench zeroes a buffer) leaves the L2 full of dirty lines,
    and the timed kernel then pays for writing them back (docs/results-h200.md has the H200's copy rates after
    each). A reading flush also writes back, before the timed region, what the previous repetition left dirty.
    """

    METHOD = "read"  # recorded with each measurement (older results were taken with a writing flush)

    def __init__(self, device: torch.device) -> None:
        props = torch.cuda.get_device_properties(device)
        l2_bytes = getattr(props, "L2_cache_size", 0) or 64 * 2**20
        self.buffer = torch.zeros(2 * l2_bytes, dtype=torch.int8, device=device)

    def __call__(self) -> None:
        self.buffer.sum(dtype=torch.int32)


def benchmark(
    fn: Callable[[], object],
    *,
    label: str = "",
    device: str | torch.device | None = None,
    timing: Timing | Mapping[str, object] | None = None,
    pitfall: Pitfall | None = None,
    **changes: float | int | bool,
) -> Measurement:
    """Time `fn()` (no arguments: bind them with a lambda or functools.partial).

    timing: how (a `Timing`; None: the defaults); changes: any of its fields as keywords, over `timing`
    (e.g. ``benchmark(fn, rep_ms=100, flush_l2=False)``).
    Also recorded: host_ms, how long one call takes to return on the host (its dispatch cost). On CUDA the stream
    is kept busy about twice that long before each start event, so host launch latency stays out of the GPU time.
    pitfall: "no_warmup" times from the first call on; "no_sync" reads a host clock around the call without
    synchronizing, so it times the launch only. Both are wrong on purpose.
    cuda_graph on a device other than CUDA raises ValueError (there is no graph to capture).
    """
    if pitfall is not None and pitfall not in PITFALLS:
        raise ValueError(f"unknown pitfall {pitfall!r}; known: {', '.join(PITFALLS)}")
    t = Timing.of(timing, **changes)
    dev, sync = _device_and_sync(device)
    if t.cuda_graph and dev.type != "cuda":
        raise ValueError(f"cuda_graph=True needs a CUDA device; this benchmark runs on {dev.type}")

    if pitfall == "no_sync":
        for _ in range(t.min_warmup):
            fn()
        sync()
        samples = _host_times(fn, max(t.min_reps, 10))
        sync()
        return Measurement(samples, mode="no_sync", device=str(dev), label=label)

    if pitfall == "no_warmup":
        return Measurement(_timed_with_sync(fn, sync, t.min_reps), mode="no_warmup", device=str(dev), label=label)

    return benchmark_side_by_side({label: fn}, rounds=1, device=dev, timing=t)[label]


def benchmark_side_by_side(
    fns: Mapping[str, Callable[[], object]],
    *,
    rounds: int = 5,
    device: str | torch.device | None = None,
    timing: Timing | Mapping[str, object] | None = None,
    **changes: float | int | bool,
) -> Measurements:
    """Time callables that are to be compared by taking turns: each is warmed up, then in each of `rounds` rounds each
    runs a 1/rounds share of its repetitions. Whatever drifts while they are timed (clocks under a power limit,
    temperature, a neighbour) falls on all of them alike, which timing one after the other does not give.

    timing / changes: as for `benchmark`, per callable; the samples of all rounds make one Measurement, keyed like
    `fns`. With cuda_graph (on CUDA) each callable's graph replays are timed one callable after the other, not in
    turns.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    if not fns:
        raise ValueError("benchmark_side_by_side needs at least one callable")
    t = Timing.of(timing, **changes)
    dev, sync = _device_and_sync(device)
    plan = functools.partial(_warm_up_and_plan, sync=sync, timing=t)
    if dev.type == "cuda" and t.cuda_graph:
        out = Measurements()
        for name, fn in fns.items():
            reps, host_ms = plan(fn)
            with torch.cuda.device(dev), distributed.timed_region():
                samples = _graph_times(fn, reps)
            out[name] = Measurement(samples, mode="cuda_graph", device=str(dev), label=name, host_ms=host_ms)
        return out
    if t.cuda_graph:
        raise ValueError(f"cuda_graph=True needs a CUDA device; this benchmark runs on {dev.type}")
    notes: list[str] = []
    timed = _repetitions(dev, sync, t.flush_l2)
    samples: dict[str, list[float]] = {name: [] for name in fns}
    with CpuPressure() as pressure:  # over the warm-up too: a timing of a few calls can be shorter than PSI's grain
        plans = {name: plan(fn) for name, fn in fns.items()}
        with distributed.timed_region():  # --isolate on many GPUs: one rank times at a time
            for turn in range(rounds):
                for name, fn in fns.items():
                    reps, host_ms = plans[name]
                    share = reps // rounds + (turn < reps % rounds)  # the shares add up to reps
                    if share:
                        samples[name] += timed(fn, share, host_ms)
    mode = "events" if dev.type == "cuda" else "perf_counter"
    cpu_busy, busy_source = (pressure.busy, pressure.source) if dev.type == "cpu" else (None, None)
    flushed = t.flush_l2 and dev.type == "cuda"
    return Measurements(
        (
            name,
            Measurement(
                samples[name],
                mode=mode,
                device=str(dev),
                label=name,
                host_ms=plans[name][1],
                flushed_l2=flushed,
                rounds=rounds,
                notes=list(notes),
                cpu_busy=cpu_busy,
                cpu_busy_source=busy_source,
            ),
        )
        for name in fns
    )


class CpuPressure:
    """While the block runs: the share of its wall time during which a task waited for a CPU. Read from Linux's
    pressure stall information (/proc/pressure/cpu, "some" total in us: any task of the machine or cgroup); where
    that is not readable (PSI off, as some distributions' kernels have it, or hidden in a container), from this
    process's own threads (/proc/self/task/*/schedstat: the time each was runnable but waiting for a CPU; the
    largest share of the wall time). `busy` is None where neither is readable (another OS); `source` names the one
    read ("/proc/pressure/cpu" or "schedstat")."""

    PATH = "/proc/pressure/cpu"
    TASKS = "/proc/self/task"

    def __init__(self) -> None:
        self.busy: float | None = None
        self.source: str | None = None

    @classmethod
    def stalled_us(cls) -> int | None:
        try:
            with open(cls.PATH) as f:
                return int(f.readline().rsplit("total=", 1)[1])
        except (OSError, ValueError, IndexError):
            return None

    @classmethod
    def own_wait_ns(cls) -> dict[str, int] | None:
        """{thread id: ns it has waited on a run queue} for this process's threads (None where unreadable)."""
        waits = {}
        try:
            threads = os.listdir(cls.TASKS)
        except OSError:
            return None
        for tid in threads:
            try:
                with open(f"{cls.TASKS}/{tid}/schedstat") as f:
                    waits[tid] = int(f.read().split()[1])
            except (OSError, ValueError, IndexError):
                continue  # a thread that ended meanwhile
        return waits or None

    def __enter__(self) -> CpuPressure:
        stalled = self.stalled_us()
        self._start = (stalled, None if stalled is not None else self.own_wait_ns(), time.perf_counter())
        return self

    def __exit__(self, *exc: object) -> None:
        stalled0, waits0, start = self._start
        wall = time.perf_counter() - start
        if wall <= 0:
            return
        if stalled0 is not None:
            stalled = self.stalled_us()
            if stalled is not None:
                self.busy, self.source = (stalled - stalled0) / (wall * 1e6), self.PATH
        elif waits0 is not None:
            waits = self.own_wait_ns() or {}
            waited = [ns - waits0.get(tid, 0) for tid, ns in waits.items()]  # a thread begun meanwhile: all of it
            if waited:
                self.busy, self.source = max(waited) / (wall * 1e9), "schedstat"


def _device_and_sync(device: str | torch.device | None) -> tuple[torch.device, Callable[[], None]]:
    """The device to time on (the current CUDA device, else the CPU, if None) and how to wait for it."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else _no_sync
    return dev, sync


def _no_sync() -> None:
    """The CPU's synchronize: nothing runs asynchronously there."""


def _warm_up_and_plan(fn: Callable[[], object], sync: Callable[[], None], timing: Timing) -> tuple[int, float]:
    """Warm fn up; return (repetitions that fill about rep_ms within the bounds, median host ms for a call).

    On the CPU a call's host time is its time, so the warm-up's closing burst gives it (no extra calls).
    """
    per_call_ms = _warm_up(fn, sync, timing.warmup_ms, timing.min_warmup)
    reps = int(min(timing.max_reps, max(timing.min_reps, timing.rep_ms / max(per_call_ms, 1e-6))))
    if sync is _no_sync:
        return reps, per_call_ms
    host_ms = statistics.median(_host_times_synced(fn, sync, min(reps, 20)))
    return reps, host_ms


def _repetitions(
    dev: torch.device, sync: Callable[[], None], flush_l2: bool
) -> Callable[[Callable[[], object], int, float], list[float]]:
    """timed(fn, reps, host_ms) -> ms per call: CUDA events (L2 flushed first if asked) on a GPU, else perf_counter."""
    if dev.type != "cuda":
        return lambda fn, reps, host_ms: _timed_with_sync(fn, sync, reps)
    flusher = L2Flusher(dev) if flush_l2 else None

    def timed(fn: Callable[[], object], reps: int, host_ms: float) -> list[float]:
        with torch.cuda.device(dev):
            return _event_times(fn, reps, flusher, cover_ms=2 * host_ms + 0.02)

    return timed


def _warm_up(fn: Callable[[], object], sync: Callable[[], None], warmup_ms: float, min_warmup: int) -> float:
    """Call fn until both min_warmup calls and warmup_ms have passed; return the last calls' mean time (ms)."""
    sync()
    start = time.perf_counter()
    calls = 0
    while True:
        fn()
        calls += 1
        if calls >= min_warmup:
            sync()
            if (time.perf_counter() - start) * 1e3 >= warmup_ms:
                break
    # estimate from a short synced burst, now that clocks and caches are warm
    burst = _timed_with_sync(fn, sync, 3)
    return statistics.median(burst)


def _timed_with_sync(fn: Callable[[], object], sync: Callable[[], None], reps: int) -> list[float]:
    samples = []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        samples.append((time.perf_counter() - t0) * 1e3)
    return samples


def _host_times(fn: Callable[[], object], reps: int) -> list[float]:
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    return samples


def _host_times_synced(fn: Callable[[], object], sync: Callable[[], None], reps: int) -> list[float]:
    """Host time for one call to return, each call starting on an idle device."""
    samples = []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    sync()
    return samples


def _event_times(fn: Callable[[], object], reps: int, flusher: L2Flusher | None, cover_ms: float) -> list[float]:
    """Events around each call. Before each start event the stream is kept busy for cover_ms (a spin kernel), so
    the host has queued the call before the GPU reaches the event: the sample is the GPU's time, not the host's
    launch latency (which `host_ms` reports)."""
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    spin_cycles = int(cover_ms * _spin_cycles_per_ms())
    torch.cuda.synchronize()
    for start, end in zip(starts, ends, strict=True):
        if flusher is not None:
            flusher()
        if spin_cycles:
            torch.cuda._sleep(spin_cycles)
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]


@functools.cache
def _spin_cycles_per_ms() -> float:
    """Clock cycles of torch.cuda._sleep per millisecond on this GPU (0 where _sleep is missing)."""
    if not hasattr(torch.cuda, "_sleep"):
        return 0.0
    cycles = 2_000_000
    torch.cuda._sleep(cycles)  # warm-up
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    torch.cuda.synchronize()
    return cycles / max(start.elapsed_time(end), 1e-3)


GRAPH_CALLS = 10


def _graph_times(fn: Callable[[], object], reps: int) -> list[float]:
    """Capture GRAPH_CALLS calls of fn in one graph; each sample is one replay's time / GRAPH_CALLS."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # side-stream warm-up, as torch.cuda.graphs requires
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(GRAPH_CALLS):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    replays = max(3, reps // GRAPH_CALLS)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(replays)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(replays)]
    for start, end in zip(starts, ends, strict=True):
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) / GRAPH_CALLS for s, e in zip(starts, ends, strict=True)]


# ---------------------------------------------------------------------------------------------- the cost of a call


@dataclass(frozen=True)
class CallCost:
    """What a call costs when calls come back to back, as a model makes them (no stream padding, no flush).

    host_us: host time to issue one call (the loop of `calls` calls before the final synchronize, per call): the
    dispatch cost, what Python, checks, allocation and the launch take. end_to_end_us: the same loop including the
    final synchronize, per call: max(host, GPU) once the queue is steady. calls / repeats: the loop's length and how
    many loops were timed (medians are reported).
    """

    host_us: float
    end_to_end_us: float
    calls: int
    repeats: int

    @property
    def host_bound(self) -> bool:
        """Whether the host is the bottleneck: the GPU finishes (almost) as soon as the host has issued the calls."""
        return self.host_us >= HOST_BOUND_FRACTION * self.end_to_end_us

    def summary(self) -> dict[str, object]:
        return {"host_us": self.host_us, "e2e_us": self.end_to_end_us, "host_bound": self.host_bound}


HOST_BOUND_FRACTION = 0.9  # host_us / end_to_end_us above this: launch-bound
MAX_CALLS = 500  # kept below the launch queue's depth (~1000), so the host never waits for the GPU while issuing


def call_cost(
    fn: Callable[[], object],
    *,
    device: str | torch.device | None = None,
    budget_ms: float = 100.0,
    repeats: int = 5,
    warmup: int = 10,
    max_calls: int = MAX_CALLS,
    clock: Callable[[], float] = time.perf_counter,
    sync: Callable[[], None] | None = None,
) -> CallCost:
    """Time `fn()` (no arguments) called back to back: host cost and end-to-end time per call, in microseconds.

    After `warmup` calls, a short synced burst estimates the time a call takes; each of `repeats` loops then runs
    as many calls as fit in budget_ms / repeats (between 10 and max_calls), reading the clock after the last call is
    issued (host) and after a synchronize (end to end). Nothing pads the stream and no L2 flush runs, unlike
    `benchmark`, so a kernel shorter than its launch shows the host's cost, as it does in a model.
    clock / sync: the clock (seconds) and how to wait for the device; default perf_counter and the device's sync.
    """
    if repeats < 1 or max_calls < 1:
        raise ValueError(f"call_cost needs repeats >= 1 and max_calls >= 1, got {repeats} and {max_calls}")
    if sync is None:
        _, sync = _device_and_sync(device)
    for _ in range(warmup):
        fn()
    sync()
    start = clock()
    for _ in range(3):
        fn()
    sync()
    per_call_ms = max((clock() - start) * 1e3 / 3, 1e-6)
    calls = round(min(max_calls, max(10, budget_ms / repeats / per_call_ms)))
    host, total = [], []
    for _ in range(repeats):
        sync()
        start = clock()
        for _ in range(calls):
            fn()
        issued = clock()
        sync()
        done = clock()
        host.append((issued - start) * 1e6 / calls)
        total.append((done - start) * 1e6 / calls)
    return CallCost(statistics.median(host), statistics.median(total), calls, repeats)
