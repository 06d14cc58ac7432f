"""`fuselab device` as a user reads it: the ceilings, and whether they can be trusted."""

import json

from fuselab.bench import ceilings
from fuselab.bench.env import environment
from fuselab.cli import main


def test_device_says_when_the_ceilings_were_measured_on_a_busy_cpu(tmp_path, monkeypatch, capsys):
    """Cached ceilings (made up: `fuselab device --quick` measuring is tests/cli/test_provenance_files.py's) that were
    timed beside other work: the table shows them, and a line says they read low."""
    monkeypatch.setenv("FUSELAB_CACHE", str(tmp_path / "cache"))
    cached = {"copy_gbps": 12.0, "matmul_tflops": {"fp32": 0.05, "bf16": 0.02}, "matmul_n": 256, "launch_us": 3.0}
    cached |= {"tiny_kernel_us": 2.0, "env": environment("cpu"), "quick": False, "cpu_busy": 0.6}  # timed when busy
    path = ceilings.cache_dir() / f"{ceilings.cache_key('cpu')}.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(cached))
    assert main(["device", "--device", "cpu"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "│ copy bandwidth │ 12.0 GB/s" in out and "│ matmul bf16 (256³) │ 20.0 GFLOP/s" in out  # the cached ones
    assert "ceilings were measured while the CPU was busy (some task waited for a CPU 60% of the time)" in out
