"""Does fuselab's timer read what other timers read? Two studies of the harness itself (no op: PyTorch's own calls).

`crosscheck`: three workloads far larger than L2 (a device copy, F.gelu (tanh), a matmul) timed by fuselab's
`benchmark`, by `triton.testing.do_bench` and from torch.profiler's kernel durations, the three taking turns over
`rounds` rounds; each timer's figure is the median of its rounds, and a workload agrees when fuselab is within
`tolerance` (a fraction) of both. `conditions`: one matmul timed under each timer's conditions (fuselab with and
without its L2 flush and its spin cover, do_bench's zeroing flush, calls back to back), taking turns, with the SM
clock read after each (NVML, where torch reaches it): the cause of a gap between timers, in one table.

do_bench and the profiler's kernel durations need a CUDA GPU (as does the spin cover): on the CPU those columns are
None, with the reason in `unavailable`. Times in milliseconds, clocks in MHz, sizes in elements.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F

from fuselab.bench import timer
from fuselab.bench.env import provenance
from fuselab.bench.timer import benchmark

Call = Callable[[], object]

TOLERANCE = 0.03  # fuselab within 3% of both other timers
NEEDS_GPU = "needs a CUDA GPU"


def _on_gpu(device: str) -> bool:
    return torch.device(device).type == "cuda"


def _sync(device: str) -> None:
    if _on_gpu(device):
        torch.cuda.synchronize(device)


# ------------------------------------------------------------------------------------------ the other timers


def do_bench_ms(fn: Call, rep_ms: float) -> float:
    """triton.testing.do_bench's median (it zeroes a 256 MB buffer before each call), ms. CUDA only."""
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=200, rep=rep_ms, return_mode="median"))


def profiler_ms(fn: Call, calls: int = 30) -> float:
    """Median over `calls` calls of one call's summed GPU kernel time, read from torch.profiler, ms. CUDA only."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time > 0]
    per_call = max(1, len(kernels) // calls)
    sums = [sum(k.device_time for k in kernels[i : i + per_call]) for i in range(0, per_call * calls, per_call)]
    return statistics.median(sums) / 1e3  # us -> ms


def back_to_back_ms(fn: Call, device: str, calls: int = 100) -> float:
    """Mean time of `calls` calls launched back to back (no flush, no gap), ms: CUDA events around them on a GPU,
    perf_counter on the CPU."""
    for _ in range(5):
        fn()
    _sync(device)
    if not _on_gpu(device):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - start) * 1e3 / calls
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(calls):
        fn()
    end.record()
    torch.cuda.synchronize()
    return begin.elapsed_time(end) / calls


def sm_clock_mhz() -> int | None:
    """The SM clock now (NVML through torch), MHz; None where it cannot be read."""
    try:
        return int(torch.cuda.clock_rate())
    except Exception:  # no GPU, no NVML
        return None


@contextmanager
def without_spin_cover() -> Iterator[None]:
    """fuselab's timer without the spin kernel it queues before each start event (a study of what the spin does)."""
    spin = timer._spin_cycles_per_ms
    timer._spin_cycles_per_ms = lambda: 0.0
    try:
        yield
    finally:
        timer._spin_cycles_per_ms = spin


# ------------------------------------------------------------------------------------------ crosscheck


def workloads(device: str, quick: bool = False) -> dict[str, Call]:
    """name -> a callable launching the workload once. GPU: a 2 GiB fp32 copy, F.gelu on 2^28 fp32, an 8192^3 bf16
    matmul (quick: 64 MiB, 2^22, 2048^3); CPU: 256 KiB, 2^16, a 64^3 fp32 matmul."""
    gpu = _on_gpu(device)
    copy_n, gelu_n, mm_n = ((2**24, 2**22, 2048) if quick else (2**29, 2**28, 8192)) if gpu else (2**16, 2**16, 64)
    mm_dtype = torch.bfloat16 if gpu else torch.float32
    src = torch.rand(copy_n, device=device)
    dst = torch.empty_like(src)
    x = torch.randn(gelu_n, device=device)
    a, b = (torch.randn(mm_n, mm_n, device=device, dtype=mm_dtype) for _ in range(2))
    mm_name = str(mm_dtype).removeprefix("torch.").replace("bfloat16", "bf16").replace("float32", "fp32")
    return {
        f"copy {copy_n * 4 / 2**20:g} MiB fp32": lambda: dst.copy_(src),
        f"F.gelu tanh 2^{gelu_n.bit_length() - 1} fp32": lambda: F.gelu(x, approximate="tanh"),
        f"matmul {mm_n}^3 {mm_name}": lambda: a @ b,
    }


@dataclass
class CrosscheckRound:
    """One round of the three timers on one workload, ms (None: the timer cannot run here)."""

    fuselab: float
    fuselab_iqr: float
    fuselab_n: int
    do_bench: float | None
    profiler: float | None


@dataclass
class TimerAgreement:
    """One workload: each timer's median over the rounds (ms), fuselab's relative difference to the others
    (fuselab / other - 1) and whether both are within the tolerance (None: no other timer ran)."""

    workload: str
    fuselab_median_ms: float
    fuselab_iqr_ms: float
    fuselab_n: int
    do_bench_median_ms: float | None
    profiler_median_ms: float | None
    vs_do_bench: float | None
    vs_profiler: float | None
    agrees: bool | None
    rounds: list[CrosscheckRound]


@dataclass
class Crosscheck:
    """The crosscheck's result: one TimerAgreement per workload; `unavailable`: timer -> why it did not run."""

    device: str
    tolerance: float
    rows: list[TimerAgreement]
    unavailable: dict[str, str] = field(default_factory=dict)
    env: dict = field(default_factory=dict)

    @property
    def disagreements(self) -> list[str]:
        return [r.workload for r in self.rows if r.agrees is False]

    def to_json(self) -> dict:
        return asdict(self)

    def text(self) -> str:
        def other(ms: float | None, vs: float | None) -> str:
            return "n/a" if ms is None else f"{ms:8.4f} ({100 * vs:+.1f}%)"

        verdict = {True: "agrees", False: "DISAGREES", None: "alone"}
        lines = [
            f"{r.workload:26s} fuselab {r.fuselab_median_ms:8.4f} ms"
            f"  do_bench {other(r.do_bench_median_ms, r.vs_do_bench)}"
            f"  profiler {other(r.profiler_median_ms, r.vs_profiler)}  {verdict[r.agrees]}"
            for r in self.rows
        ]
        lines += [f"{name}: not run ({why})" for name, why in self.unavailable.items()]
        return "\n".join(lines)


def _relative(ours: float, theirs: float | None) -> float | None:
    return None if theirs is None else ours / theirs - 1


def crosscheck(
    device: str, *, rounds: int = 3, rep_ms: float = 1000 / 3, quick: bool = False, tolerance: float = TOLERANCE
) -> Crosscheck:
    """Time each of `workloads(device, quick)` with the three timers, taking turns `rounds` times, each timer
    repeating for about rep_ms (ms) per round; see the module's docstring."""
    gpu = _on_gpu(device)
    unavailable = {} if gpu else {"do_bench": NEEDS_GPU, "profiler": NEEDS_GPU}
    rows = []
    for name, fn in workloads(device, quick).items():
        seen = []
        for _ in range(rounds):
            ours = benchmark(fn, label=name, device=device, rep_ms=rep_ms)
            seen.append(
                CrosscheckRound(
                    fuselab=ours.median_ms,
                    fuselab_iqr=ours.iqr_ms,
                    fuselab_n=ours.n,
                    do_bench=do_bench_ms(fn, rep_ms) if gpu else None,
                    profiler=profiler_ms(fn) if gpu else None,
                )
            )
        ours_ms = statistics.median(r.fuselab for r in seen)
        theirs = statistics.median(r.do_bench for r in seen) if gpu else None
        prof = statistics.median(r.profiler for r in seen) if gpu else None
        vs_do_bench, vs_profiler = _relative(ours_ms, theirs), _relative(ours_ms, prof)
        agrees = None if not gpu else abs(vs_do_bench) <= tolerance and abs(vs_profiler) <= tolerance
        rows.append(
            TimerAgreement(
                workload=name,
                fuselab_median_ms=ours_ms,
                fuselab_iqr_ms=statistics.median(r.fuselab_iqr for r in seen),
                fuselab_n=sum(r.fuselab_n for r in seen),
                do_bench_median_ms=theirs,
                profiler_median_ms=prof,
                vs_do_bench=vs_do_bench,
                vs_profiler=vs_profiler,
                agrees=agrees,
                rounds=seen,
            )
        )
    return Crosscheck(device, tolerance, rows, unavailable, provenance(device))


# ------------------------------------------------------------------------------------------ conditions


@dataclass
class ConditionRound:
    """One round of one condition: its time (ms) and the SM clock read right after (MHz; None: not readable)."""

    ms: float
    sm_clock_mhz_after: int | None


@dataclass
class ConditionRow:
    """One timer's condition: the median over its rounds (ms), the matmul's TFLOP/s at it, or why it did not run."""

    condition: str
    median_ms: float | None
    tflops: float | None
    rounds: list[ConditionRound]
    unavailable: str | None = None


@dataclass
class TimerConditions:
    """The conditions study: an n^3 matmul in `dtype`, one ConditionRow per condition."""

    device: str
    n: int
    dtype: str
    rounds: int
    rows: list[ConditionRow]
    env: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return asdict(self)

    def text(self) -> str:
        lines = []
        for r in self.rows:
            if r.median_ms is None:
                lines.append(f"{r.condition:42s} not run ({r.unavailable})")
                continue
            clocks = [c.sm_clock_mhz_after for c in r.rounds]
            lines.append(f"{r.condition:42s} {r.median_ms:8.4f} ms  {r.tflops:8.3g} TFLOP/s  SM clock after: {clocks}")
        return "\n".join(lines)


def timer_conditions(device: str, *, rounds: int = 3, rep_ms: float = 300.0, quick: bool = False) -> TimerConditions:
    """An n^3 matmul (GPU: 8192 bf16, quick 2048; CPU: 64 fp32) timed under each timer's conditions, the conditions
    taking turns `rounds` times; see the module's docstring."""
    gpu = _on_gpu(device)
    n = (2048 if quick else 8192) if gpu else 64
    dtype = torch.bfloat16 if gpu else torch.float32
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))

    def matmul() -> torch.Tensor:
        return a @ b

    def fuselab_without_spin() -> float:
        with without_spin_cover():
            return benchmark(matmul, device=device, rep_ms=rep_ms).median_ms

    conditions: dict[str, Callable[[], float] | str] = {
        "fuselab (reading flush, spin cover)": lambda: benchmark(matmul, device=device, rep_ms=rep_ms).median_ms,
        "fuselab without L2 flush": lambda: benchmark(matmul, device=device, rep_ms=rep_ms, flush_l2=False).median_ms,
        "fuselab without spin cover": fuselab_without_spin if gpu else NEEDS_GPU,
        "do_bench (zeroing flush)": (lambda: do_bench_ms(matmul, rep_ms)) if gpu else NEEDS_GPU,
        "back to back (100 calls)": lambda: back_to_back_ms(matmul, device),
    }
    seen: dict[str, list[ConditionRound]] = {name: [] for name in conditions}
    for _ in range(rounds):
        for name, measure in conditions.items():
            if callable(measure):
                seen[name].append(ConditionRound(measure(), sm_clock_mhz() if gpu else None))
    rows = []
    for name, measure in conditions.items():
        if not callable(measure):
            rows.append(ConditionRow(name, None, None, [], unavailable=measure))
            continue
        ms = statistics.median(r.ms for r in seen[name])
        rows.append(ConditionRow(name, ms, 2 * n**3 / ms / 1e9, seen[name]))
    return TimerConditions(device, n, str(dtype).removeprefix("torch."), rounds, rows, provenance(device))
