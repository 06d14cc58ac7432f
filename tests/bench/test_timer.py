import dataclasses
import glob
import time

import pytest
import torch

from fuselab.bench import Measurement, Timing, benchmark, benchmark_side_by_side
from fuselab.bench.timer import CpuPressure


def test_statistics_of_known_samples():
    m = Measurement([5.0, 1.0, 3.0, 2.0, 4.0], mode="events", device="cuda:0")
    assert m.median_ms == 3.0
    assert m.mean_ms == 3.0
    assert (m.min_ms, m.max_ms) == (1.0, 5.0)
    assert m.quantile_ms(0.25) == 2.0 and m.quantile_ms(0.75) == 4.0
    assert m.iqr_ms == 2.0
    assert m.summary()["n"] == 5


def test_noisy_measurement_warns_and_tight_one_does_not():
    tight = Measurement([1.0, 1.01, 0.99, 1.0, 1.0, 1.02], mode="events", device="cuda:0")
    noisy = Measurement([1.0, 2.0, 1.0, 2.0, 1.0, 2.0], mode="events", device="cuda:0")
    assert tight.warnings == []
    assert any("IQR" in w for w in noisy.warnings)
    assert "IQR" in str(noisy)


def test_empty_measurement_is_an_error():
    with pytest.raises(ValueError):
        Measurement([], mode="events", device="cpu")


def test_cpu_benchmark_times_the_call():
    m = benchmark(lambda: time.sleep(0.002), warmup_ms=5, rep_ms=40, min_reps=5)
    assert m.mode == "perf_counter"
    assert 1.9 <= m.median_ms <= 6.0
    assert m.n >= 5


def test_warmup_keeps_a_slow_first_call_out_and_no_warmup_shows_it():
    def make():
        calls = []

        def fn():
            time.sleep(0.05 if not calls else 0.001)
            calls.append(1)

        return fn

    proper = benchmark(make(), warmup_ms=1, min_warmup=2, rep_ms=10, min_reps=5)
    cold = benchmark(make(), pitfall="no_warmup", min_reps=5)
    assert proper.median_ms < 10
    assert cold.samples_ms[0] > 40  # the first, cold call is in the pitfall's samples
    assert cold.mode == "no_warmup" and any("pitfall" in w for w in cold.warnings)


def test_host_time_is_recorded():
    x = torch.randn(1000)
    m = benchmark(lambda: x * 2, warmup_ms=1, rep_ms=5)
    assert m.host_ms is not None and m.host_ms > 0


def test_unknown_pitfall_is_rejected():
    with pytest.raises(ValueError, match="no_sync"):
        benchmark(lambda: None, pitfall="no_clock")


@pytest.mark.gpu
def test_no_sync_pitfall_underreports_gpu_time():
    a = torch.randn(4096, 4096, device="cuda")
    right = benchmark(lambda: a @ a, rep_ms=100)
    wrong = benchmark(lambda: a @ a, pitfall="no_sync")
    assert right.mode == "events" and right.flushed_l2
    assert wrong.median_ms < right.median_ms / 3


@pytest.mark.gpu
def test_host_latency_stays_out_of_the_gpu_time():
    """A call whose host side is slow (2 ms of Python) before a tiny kernel: the GPU time is the kernel's."""
    x = torch.randn(1024, device="cuda")

    def slow_host():
        time.sleep(0.002)
        x.mul_(1.0)

    m = benchmark(slow_host, rep_ms=50)
    assert m.host_ms > 1.9
    assert m.median_ms < 0.5


@pytest.mark.gpu
def test_cuda_graph_mode_and_events_agree_for_a_large_kernel():
    """The fastest sample of each mode, both timed in turns, three runs each. The gate runs this test beside other GPU
    jobs, whose kernels take turns with it: a sample of the graph mode, one replay of GRAPH_CALLS calls, lets in more
    of theirs than one call does, so the medians part (docs/gate.md). A sample is its own calls' time plus whatever
    ran between them: the fastest of each mode is the one least taken by others."""
    x = torch.randn(2**26, device="cuda")
    events, graph = [], []
    for _ in range(3):
        events.append(benchmark(lambda: x.mul_(1.0), flush_l2=False, rep_ms=50))
        graph.append(benchmark(lambda: x.mul_(1.0), cuda_graph=True, rep_ms=50))
    assert all(m.mode == "cuda_graph" for m in graph)
    fastest_events = min(min(m.samples_ms) for m in events)
    fastest_graph = min(min(m.samples_ms) for m in graph)
    assert abs(fastest_graph - fastest_events) / fastest_events < 0.1


@pytest.mark.gpu
def test_l2_flush_evicts():
    """A read-only call on 16 MiB, which fits in L2: flushed it reads DRAM (on an H200 1183 GB/s against 1469 served
    from L2, git show 3d597b8:benchmarks/results/h200/logs/l2_flush_2.log), so it takes longer than unflushed."""
    x = torch.rand(2**22, device="cuda")
    flushed = benchmark(lambda: x.sum(), rep_ms=100)
    cached = benchmark(lambda: x.sum(), flush_l2=False, rep_ms=100)
    assert flushed.summary()["l2_flush"] == "read" and cached.summary()["l2_flush"] is None
    assert flushed.median_ms > 1.1 * cached.median_ms


def _drifting_pair():
    """Two identical calls on a machine that slows down with every call (as clocks do under a power limit)."""
    calls = []

    def make(name):
        def fn():
            calls.append(name)
            time.sleep(0.0002 + 0.00005 * len(calls))

        return fn

    return {"a": make("a"), "b": make("b")}, calls


def test_side_by_side_takes_turns_and_keeps_every_repetition():
    fns, calls = _drifting_pair()
    timed = benchmark_side_by_side(fns, rounds=4, warmup_ms=0, min_warmup=1, rep_ms=0, min_reps=10, max_reps=10)
    assert set(timed) == {"a", "b"}
    assert all(m.n == 10 and m.rounds == 4 and m.mode == "perf_counter" for m in timed.values())
    assert timed["a"].summary()["rounds"] == 4
    last = calls[-20:]  # the timed calls: shares of 3, 3, 2, 2 repetitions, a then b, four times over
    assert last == ["a"] * 3 + ["b"] * 3 + ["a"] * 3 + ["b"] * 3 + ["a"] * 2 + ["b"] * 2 + ["a"] * 2 + ["b"] * 2


def test_side_by_side_spreads_drift_over_both_where_one_after_the_other_does_not():
    fns, _ = _drifting_pair()
    kw = {"warmup_ms": 0, "min_warmup": 1, "rep_ms": 0, "min_reps": 30, "max_reps": 30}
    apart = benchmark_side_by_side(fns, rounds=1, **kw)
    fns, _ = _drifting_pair()
    turns = benchmark_side_by_side(fns, rounds=15, **kw)
    ratio_apart = apart["b"].median_ms / apart["a"].median_ms
    ratio_turns = turns["b"].median_ms / turns["a"].median_ms
    assert ratio_apart > 1.25  # b ran after all of a's repetitions, on a slower machine
    assert abs(ratio_turns - 1) < (ratio_apart - 1) / 3


def test_side_by_side_rejects_no_rounds_and_no_callables():
    with pytest.raises(ValueError, match="rounds"):
        benchmark_side_by_side({"a": lambda: None}, rounds=0)
    with pytest.raises(ValueError, match="at least one"):
        benchmark_side_by_side({})


def test_timing_is_one_frozen_dataclass_built_from_a_mapping_or_changes():
    t = Timing(rep_ms=20.0, min_reps=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.rep_ms = 1.0  # type: ignore[misc]
    assert Timing.of(None) == Timing()
    assert Timing.of({"rep_ms": 20.0, "min_reps": 3}) == t  # a budget or JSON mapping
    assert Timing.of(t) is t
    assert Timing.of(t, flush_l2=False) == dataclasses.replace(t, flush_l2=False)
    assert Timing.of(t.to_dict()) == t
    with pytest.raises(TypeError, match=r"unknown timing option\(s\) rep_s; known: warmup_ms, min_warmup, rep_ms"):
        Timing.of({"rep_s": 5})


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"rep_ms": -1.0}, r"rep_ms must be a number of milliseconds >= 0, got -1\.0"),
        ({"warmup_ms": "5"}, r"warmup_ms must be a number of milliseconds >= 0"),
        ({"min_reps": 0}, r"min_reps must be an integer >= 1, got 0"),
        ({"max_reps": 2.5}, r"max_reps must be an integer >= 1"),
        ({"min_reps": 10, "max_reps": 5}, r"max_reps \(5\) is below min_reps \(10\)"),
        ({"flush_l2": 1}, r"flush_l2 must be True or False"),
    ],
)
def test_bad_timing_is_refused_with_a_clear_message(bad, message):
    with pytest.raises(ValueError, match=message):
        Timing(**bad)


def test_benchmark_takes_a_timing_and_keywords_over_it():
    calls = []

    def fn():
        calls.append(1)

    m = benchmark(fn, timing=Timing(warmup_ms=0.0, min_warmup=1, rep_ms=0.0, min_reps=7, max_reps=7))
    assert m.n == 7
    m = benchmark(fn, timing=Timing(warmup_ms=0.0, rep_ms=0.0, min_reps=7, max_reps=7), min_reps=4, max_reps=4)
    assert m.n == 4  # the keywords win over the Timing
    m = benchmark(fn, warmup_ms=0.0, rep_ms=0.0, min_reps=5, max_reps=5)  # keywords alone, as before
    assert m.n == 5
    both = benchmark_side_by_side({"a": fn, "b": fn}, rounds=2, timing={"warmup_ms": 0.0, "rep_ms": 0.0, "min_reps": 3})
    assert [both[k].n for k in "ab"] == [3, 3]
    with pytest.raises(TypeError, match="unknown timing option"):
        benchmark(fn, reps=3)


def test_cuda_graph_on_the_cpu_is_refused_not_silently_dropped():
    with pytest.raises(ValueError, match="CUDA device"):
        benchmark(lambda: None, warmup_ms=0.0, rep_ms=0.0, min_reps=3, cuda_graph=True, device="cpu")
    with pytest.raises(ValueError, match="CUDA device"):
        benchmark_side_by_side({"a": lambda: None}, timing=Timing(cuda_graph=True), device="cpu")


class FakeDevice:
    """A host clock and a GPU queue: each call costs the host `host_us` and queues `gpu_us` of GPU work, which starts
    when both the call is issued and the previous work is done; sync() waits for the queue."""

    def __init__(self, host_us: float, gpu_us: float) -> None:
        self.now = 0.0
        self.gpu_free = 0.0
        self.host_us, self.gpu_us = host_us, gpu_us

    def clock(self) -> float:
        return self.now

    def call(self) -> None:
        self.now += self.host_us * 1e-6
        self.gpu_free = max(self.gpu_free, self.now) + self.gpu_us * 1e-6

    def sync(self) -> None:
        self.now = max(self.now, self.gpu_free)


@pytest.mark.parametrize(("host_us", "gpu_us"), [(20.0, 4.0), (6.0, 50.0)])
def test_call_cost_reads_host_and_end_to_end_per_call(host_us: float, gpu_us: float) -> None:
    """Host-bound calls: end to end = host cost; GPU-bound: end to end = GPU time, host cost still the host's."""
    from fuselab.bench import call_cost

    dev = FakeDevice(host_us, gpu_us)
    cost = call_cost(dev.call, budget_ms=10, repeats=3, clock=dev.clock, sync=dev.sync)
    assert cost.host_us == pytest.approx(host_us)
    assert cost.end_to_end_us == pytest.approx(max(host_us, gpu_us), rel=0.05)
    assert cost.host_bound is (host_us > gpu_us)
    assert 10 <= cost.calls <= 500 and cost.repeats == 3
    assert set(cost.summary()) == {"host_us", "e2e_us", "host_bound"}


def test_call_cost_sizes_its_loops_to_the_budget_and_checks_arguments() -> None:
    from fuselab.bench import call_cost

    dev = FakeDevice(1.0, 100.0)  # 0.1 ms a call: 20 ms budget over 4 loops = 50 calls each
    assert call_cost(dev.call, budget_ms=20, repeats=4, clock=dev.clock, sync=dev.sync).calls == 50
    with pytest.raises(ValueError, match="repeats >= 1"):
        call_cost(dev.call, repeats=0, clock=dev.clock, sync=dev.sync)


def test_call_cost_on_the_cpu_times_a_real_call() -> None:
    from fuselab.bench import call_cost

    cost = call_cost(lambda: time.sleep(1e-4), device="cpu", budget_ms=20, repeats=2)
    assert cost.host_us >= 100 and cost.end_to_end_us >= cost.host_us and cost.host_bound


@pytest.mark.skipif(CpuPressure.stalled_us() is None, reason="no /proc/pressure/cpu (Linux PSI) here")
def test_a_busy_cpu_is_detected_and_marked_however_steady_the_times_look(busy_cpu):
    """Two processes running matmuls beside a CPU benchmark: tasks wait for a CPU most of the timing, and the
    Measurement says so (cpu_busy, a warning, the table's noisy mark); a Measurement that saw no such wait does not."""
    from fuselab.bench.results import row_is_noisy

    x = torch.randn(512, 512)
    busy = benchmark(lambda: torch.softmax(x, -1), device="cpu", rep_ms=200)
    assert busy.cpu_busy > 0.5 and busy.busy
    assert any("the CPU was busy" in w for w in busy.warnings)
    assert row_is_noisy({**busy.summary(), "error": None})
    quiet = Measurement([1.0, 1.0, 1.01, 1.0, 1.0], mode="perf_counter", device="cpu", cpu_busy=0.01)
    assert not quiet.busy and not quiet.warnings and not row_is_noisy({**quiet.summary(), "error": None})


@pytest.mark.skipif(not glob.glob("/proc/self/task/*/schedstat"), reason="no /proc/self/task/*/schedstat here")
def test_a_busy_cpu_is_detected_where_linux_psi_cannot_be_read(monkeypatch, busy_cpu):
    """Without /proc/pressure/cpu (PSI off, as some distributions' kernels have it, or hidden in a container) the
    timer reads how long its own threads waited for a CPU (/proc/self/task/*/schedstat): beside two matmul
    processes the Measurement still says the CPU was busy, naming where it read that."""
    monkeypatch.setattr(CpuPressure, "PATH", "/nonexistent/pressure/cpu")
    assert CpuPressure.stalled_us() is None
    x = torch.randn(512, 512)
    busy = benchmark(lambda: torch.softmax(x, -1), device="cpu", rep_ms=200)
    assert busy.cpu_busy is not None and busy.cpu_busy > 0.3 and busy.busy, busy.cpu_busy
    assert any("the CPU was busy" in w and "schedstat" in w for w in busy.warnings), busy.warnings
