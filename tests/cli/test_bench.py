"""`fuselab bench` as a user reads it on the CPU: what its table and lines flag."""

import json

from fuselab.bench import ceilings
from fuselab.cli import main


def test_bench_says_when_its_ceilings_were_measured_on_a_busy_cpu(tmp_path, monkeypatch, capsys):
    """Ceilings measured while the CPU was busy (kept for the process, never cached) read low: bench says so under
    its table, each row's warnings say so, and the results file holds them as they are."""
    monkeypatch.setenv("FUSELAB_CACHE", str(tmp_path / "cache"))
    measured = {"copy_gbps": 1.0, "matmul_tflops": {"fp32": 0.01}, "cpu_busy": 0.6, "quick": False}
    monkeypatch.setattr(ceilings, "_BUSY", {ceilings.cache_key("cpu"): measured})
    args = ["bench", "softmax", "--impl", "torch", "--shape", "8x128", "--dtype", "fp32", "--device", "cpu"]
    args += ["--rep-ms", "2", "--warmup-ms", "1", "--call-cost-ms", "0", "--out", str(tmp_path / "r.json")]
    assert main(args) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "ceilings were measured while the CPU was busy (some task waited for a CPU 60% of the time)" in out
    (row,) = json.loads((tmp_path / "r.json").read_text())["records"]
    assert any("ceilings were measured while the CPU was busy" in w for w in row["warnings"])
