"""The device's ceilings: measured honestly or not kept (a copy or matmul timed beside other work reads low, and
every rate set against it then reads high)."""

import json
import os
import time

import pytest
import torch

from fuselab.bench import ceilings
from fuselab.bench.timer import CPU_BUSY_FRACTION


def _cache(device: str = "cpu"):
    return ceilings.cache_dir() / f"{ceilings.cache_key(device)}.json"


def test_ceilings_measured_on_a_busy_cpu_say_so(tmp_path, monkeypatch, busy_cpu):
    """Beside two matmul processes the copy and the matmuls get a part of the CPU: the ceilings carry cpu_busy and
    say so (a busy measurement, cached as clean, once made every later '% copy' read high)."""
    monkeypatch.setenv("FUSELAB_CACHE", str(tmp_path))
    measure = ceilings.measure_ceilings
    quick = lambda device=None: {**measure(device, quick=True), "quick": False}  # noqa: E731  (small sizes, kept)
    monkeypatch.setattr(ceilings, "measure_ceilings", quick)
    measured = ceilings.get_ceilings("cpu")
    assert measured["cpu_busy"] > CPU_BUSY_FRACTION and ceilings.busy(measured)
    assert "measured while the CPU was busy" in ceilings.busy_note(measured)
    assert ceilings.get_ceilings("cpu", measure=False) == measured  # cached as busy: the rows say so


def test_busy_ceilings_are_used_a_while_then_measured_again_keeping_the_less_busy(tmp_path, monkeypatch):
    """A busy cache is used for BUSY_RETRY_S (a full measurement takes a CPU half a minute); after that a run
    measures again: a quiet measurement replaces it, a busier one does not (and the next retry waits again)."""
    monkeypatch.setenv("FUSELAB_CACHE", str(tmp_path))
    path = _cache()
    path.parent.mkdir(parents=True)
    quiet = {"copy_gbps": 10.0, "matmul_tflops": {"fp32": 0.1}, "cpu_busy": 0.01, "quick": False}
    busy = {**quiet, "copy_gbps": 6.0, "cpu_busy": 0.5}
    busier = {**quiet, "copy_gbps": 4.0, "cpu_busy": 0.9}
    measured = []

    def measure(device=None):
        measured.append(device)
        return dict(next_one)

    monkeypatch.setattr(ceilings, "measure_ceilings", measure)

    def age(seconds: float) -> None:
        then = time.time() - seconds
        os.utime(path, (then, then))

    path.write_text(json.dumps(busy))
    next_one = busier
    assert ceilings.get_ceilings("cpu") == busy and not measured  # fresh: used as it is, flagged
    age(ceilings.BUSY_RETRY_S + 1)
    assert ceilings.get_ceilings("cpu", measure=False) == busy and not measured
    assert ceilings.get_ceilings("cpu") == busy and measured == ["cpu"]  # measured again, busier: kept
    assert time.time() - path.stat().st_mtime < 60  # the next retry waits again
    age(ceilings.BUSY_RETRY_S + 1)
    next_one = quiet
    assert ceilings.get_ceilings("cpu") == quiet and json.loads(path.read_text()) == quiet
    age(10 * ceilings.BUSY_RETRY_S)
    assert ceilings.get_ceilings("cpu") == quiet and len(measured) == 2  # quiet: cached for good


def test_an_older_cache_measured_busy_is_seen_as_busy(tmp_path, monkeypatch):
    """A cache an older fuselab wrote has no cpu_busy of its own, only its copy's."""
    old = {"copy_gbps": 10.0, "matmul_tflops": {"fp32": 0.1}, "copy": {"cpu_busy": 0.6}, "quick": False}
    assert ceilings.busy(old) and not ceilings.busy({**old, "copy": {"cpu_busy": 0.01}})


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_the_peak_of_a_dtype_is_the_fastest_rate_its_data_can_be_multiplied_at(dtype):
    """16-bit data can be multiplied in fp32: on a CPU without bf16 units (bf16 matmuls there run 100x below fp32)
    the bf16 ceiling is fp32's; on a GPU bf16's own, far above. fp32 data: tf32 where measured, else fp32."""
    cpu = {"matmul_tflops": {"fp32": 0.17, "bf16": 0.001}}
    gpu = {"matmul_tflops": {"fp32": 51.0, "tf32": 400.0, "bf16": 685.0}}
    rates_cpu, rates_gpu = cpu["matmul_tflops"], gpu["matmul_tflops"]
    if dtype == "float32":
        assert ceilings.peak_tflops(cpu, dtype) == rates_cpu["fp32"]
        assert ceilings.peak_tflops(gpu, dtype) == rates_gpu["tf32"]
    else:
        assert ceilings.peak_tflops(cpu, dtype) == max(rates_cpu.values())
        assert ceilings.peak_tflops(gpu, dtype) == rates_gpu["bf16"]


def test_measuring_the_matmul_leaves_torchs_tf32_setting_exactly_as_it_was():
    """The matmul's TF32 mode is set and put back through the same API: setting the legacy allow_tf32 and back once
    left fp32_precision "ieee" where it was "none", which changes Inductor's cache keys (a bench process that measured
    its ceilings then missed every graph its warm-up workers had compiled)."""
    matmul = torch.backends.cuda.matmul
    before = (matmul.fp32_precision, matmul.allow_tf32)
    for on in (True, False):
        with ceilings.matmul_tf32(on):
            assert matmul.fp32_precision == ("tf32" if on else "ieee")
        assert (matmul.fp32_precision, matmul.allow_tf32) == before
    ceilings.measure_ceilings("cpu", quick=True)
    assert (matmul.fp32_precision, matmul.allow_tf32) == before


def test_a_copy_is_timed_both_as_torchs_copy_and_as_a_kernel_and_the_faster_counts(monkeypatch):
    """A CUDA graph records torch's copy of a contiguous tensor as a memcpy node, run by the copy engines at ~2.7 TB/s
    on the H200: timed alone, the copy of a draw's same size read 2536 GB/s where kernels moved 3450, and every row got
    a warning. Both copies are timed with the caller's timing and the faster one is the ceiling."""
    from fuselab.bench.timer import Measurement, Timing

    medians = {"copy": 3.0, "copy (kernel)": 2.0}
    timings = []

    def fake(fn, *, label, device, timing=None, **_):
        fn()  # each copy runs: neg writes -src, copy_ writes src
        timings.append(timing)
        return Measurement([medians[label]] * 3, mode="cuda_graph", device=device, label=label)

    monkeypatch.setattr(ceilings, "benchmark", fake)
    timing = Timing(warmup_ms=1.0, rep_ms=1.0, flush_l2=False, cuda_graph=True)
    assert ceilings.copy_gbps_at(4000, "cpu", timing) == pytest.approx(4000 / 2e-3 / 1e9)
    assert timings == [timing, timing]
    medians.update({"copy": 1.0})
    assert ceilings.copy_gbps_at(4000, "cpu", timing) == pytest.approx(4000 / 1e-3 / 1e9)


@pytest.mark.gpu
def test_gpu_a_copy_of_the_same_size_under_cuda_graphs_reaches_what_it_does_outside_them():
    """256 MiB moved, timed as a draw times its cases (CUDA-graph replays, no flush) and with events: the graph's copy
    is within 15% of the events' (before, as a memcpy node, it read ~2.7 TB/s against ~4.2)."""
    from fuselab.bench.timer import Timing

    nbytes = 256 * 2**20
    graphed = ceilings.copy_gbps_at(nbytes, "cuda", Timing(warmup_ms=5.0, rep_ms=20.0, flush_l2=False, cuda_graph=True))
    events = ceilings.copy_gbps_at(nbytes, "cuda", Timing(warmup_ms=5.0, rep_ms=20.0, flush_l2=False))
    assert graphed >= 0.85 * events, (graphed, events)
