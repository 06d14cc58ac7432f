"""`fuselab timers` on the CPU: both studies run for real on tiny workloads and write what they printed."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def fuselab(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run(
        [sys.executable, "-m", "fuselab", *args], capture_output=True, text=True, env=env, timeout=300
    )


def test_crosscheck_times_every_workload_and_says_why_the_gpu_timers_did_not_run(tmp_path):
    out = fuselab(
        "timers", "crosscheck", "--device", "cpu", "--rounds", "2", "--rep-ms", "2", "--out", str(tmp_path / "h.json")
    )
    assert out.returncode == 0, out.stderr
    result = json.loads((tmp_path / "h.json").read_text())
    assert result["device"] == "cpu" and result["env"]["torch"]
    assert [r["workload"] for r in result["rows"]] == [
        "copy 0.25 MiB fp32",
        "F.gelu tanh 2^16 fp32",
        "matmul 64^3 fp32",
    ]
    for row in result["rows"]:
        assert row["fuselab_median_ms"] > 0 and len(row["rounds"]) == 2
        assert row["do_bench_median_ms"] is None and row["agrees"] is None  # no GPU: nothing to agree with
        assert f"{row['workload']:26s} fuselab {row['fuselab_median_ms']:8.4f} ms" in out.stdout
    assert result["unavailable"] == {"do_bench": "needs a CUDA GPU", "profiler": "needs a CUDA GPU"}
    assert "do_bench: not run (needs a CUDA GPU)" in out.stdout


def test_conditions_time_the_matmul_under_each_condition_that_runs_here(tmp_path):
    out = fuselab(
        "timers", "conditions", "--device", "cpu", "--rounds", "1", "--rep-ms", "2", "--out", str(tmp_path / "c.json")
    )
    assert out.returncode == 0, out.stderr
    result = json.loads((tmp_path / "c.json").read_text())
    assert (result["n"], result["dtype"], result["rounds"]) == (64, "float32", 1)
    rows = {r["condition"]: r for r in result["rows"]}
    assert len(rows) == 5
    ran = [r for r in rows.values() if r["unavailable"] is None]
    assert {r["condition"] for r in ran} == {
        "fuselab (reading flush, spin cover)",
        "fuselab without L2 flush",
        "back to back (100 calls)",
    }
    for r in ran:
        assert r["median_ms"] > 0 and abs(r["tflops"] - 2 * 64**3 / r["median_ms"] / 1e9) < 1e-12
        assert r["condition"] in out.stdout
    assert rows["do_bench (zeroing flush)"]["median_ms"] is None
    assert "do_bench (zeroing flush)" in out.stdout and "not run (needs a CUDA GPU)" in out.stdout


def test_timers_refuses_an_unknown_study_in_one_line():
    out = fuselab("timers", "drift")
    assert out.returncode == 2 and "invalid choice: 'drift'" in out.stderr and "Traceback" not in out.stderr
