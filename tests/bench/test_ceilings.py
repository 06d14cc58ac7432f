"""The device's ceilings: measured honestly or not kept (a copy or matmul timed beside other work reads low, and
every rate set against it then reads high)."""

import json

import pytest

from fuselab.bench import ceilings
from fuselab.bench.timer import CPU_BUSY_FRACTION


def test_ceilings_measured_on_a_busy_cpu_say_so_and_are_not_cached(tmp_path, monkeypatch, busy_cpu):
    """Beside two matmul processes the copy and the matmuls get a part of the CPU: the ceilings carry cpu_busy, and
    are not written to the cache, so the next run measures them again (a cached low copy rate made every later
    '% copy' read high)."""
    monkeypatch.setenv("FUSELAB_CACHE", str(tmp_path))
    monkeypatch.setattr(ceilings, "_BUSY", {})  # what this process keeps, for this test only
    measure = ceilings.measure_ceilings
    monkeypatch.setattr(ceilings, "measure_ceilings", lambda device=None: measure(device, quick=True))
    measured = ceilings.get_ceilings("cpu")
    assert measured["cpu_busy"] > CPU_BUSY_FRACTION and ceilings.busy(measured)
    assert not (ceilings.cache_dir() / f"{ceilings.cache_key('cpu')}.json").exists()
    assert ceilings.get_ceilings("cpu", measure=False) is measured  # this process still sets its rates against them


def test_a_cached_ceiling_measured_busy_is_measured_again(tmp_path, monkeypatch):
    """A cache written while the CPU was busy (by an older fuselab: its copy's cpu_busy) is not trusted."""
    monkeypatch.setenv("FUSELAB_CACHE", str(tmp_path))
    monkeypatch.setattr(ceilings, "_BUSY", {})
    path = ceilings.cache_dir() / f"{ceilings.cache_key('cpu')}.json"
    path.parent.mkdir(parents=True)
    quiet = {"copy_gbps": 10.0, "matmul_tflops": {"fp32": 0.1}, "copy": {"cpu_busy": 0.01}, "quick": False}
    path.write_text(json.dumps(quiet))
    assert ceilings.get_ceilings("cpu", measure=False) == quiet and not ceilings.busy(quiet)
    busy = {**quiet, "copy": {"cpu_busy": 0.6}}
    path.write_text(json.dumps(busy))
    assert ceilings.busy(busy) and ceilings.get_ceilings("cpu", measure=False) is None
    fresh = {**quiet, "cpu_busy": 0.0}
    monkeypatch.setattr(ceilings, "measure_ceilings", lambda device=None: fresh)
    assert ceilings.get_ceilings("cpu") == fresh and json.loads(path.read_text()) == fresh  # measured, cached


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
