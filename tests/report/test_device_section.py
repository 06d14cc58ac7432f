"""The report's device section: the ceilings every rate is set against, and whether they can be trusted."""

import json

from fuselab.bench import ceilings
from fuselab.bench.env import environment
from fuselab.report import run_full_report


def test_the_device_section_says_when_the_ceilings_were_measured_on_a_busy_cpu(tmp_path, monkeypatch):
    """Cached ceilings (made up: measuring them is tests/bench/test_ceilings.py's) timed beside other work."""
    monkeypatch.setenv("FUSELAB_CACHE", str(tmp_path / "cache"))
    busy = {"copy_gbps": 12.0, "matmul_tflops": {"fp32": 0.05, "bf16": 0.02}, "matmul_n": 256, "launch_us": 3.0}
    busy |= {"tiny_kernel_us": 2.0, "env": environment("cpu"), "quick": False, "cpu_busy": 0.6}  # timed when busy
    path = ceilings.cache_dir() / f"{ceilings.cache_key('cpu')}.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(busy))
    run_full_report(tmp_path / "out", device="cpu", quick=True, only=["device"], show_progress=False)
    md = " ".join((tmp_path / "out" / "report.md").read_text().split())
    assert "| copy bandwidth | 12 GB/s |" in md  # the cached ceilings, not a new measurement
    assert "ceilings were measured while the CPU was busy (some task waited for a CPU 60% of the time)" in md
