"""Every results file a command writes says what measured it (issue 24): the git revision and whether the tree was
dirty, the time, host, thread count, GPU, clocks where readable, torch, Triton and CUDA versions; read back from the
files bench, check and device write on this CPU."""

from __future__ import annotations

import datetime
import json
import subprocess

import torch
from clirun import ROOT  # tests/cli/clirun.py

KEYS = {"revision", "dirty", "written", "host", "threads", "gpu", "clocks", "torch", "triton", "cuda"}
FAST = ["--rep-ms", "5", "--warmup-ms", "1", "--call-cost-ms", "0"]


def assert_provenance(env: dict) -> None:
    assert set(env) >= KEYS, KEYS - set(env)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    if head.returncode == 0:
        assert env["revision"] == head.stdout.strip() and isinstance(env["dirty"], bool)
    assert env["threads"] == torch.get_num_threads() and env["host"] and env["torch"] == torch.__version__
    assert datetime.datetime.fromisoformat(env["written"]).tzinfo is not None


def test_bench_json_its_log_rows_and_check_json_record_their_provenance(fuselab, tmp_path):
    out = tmp_path / "r.json"
    args = ["bench", "gelu", "--impl", "torch", "--dtype", "fp32", "--shape", "1000", "--opt", "approximate=tanh"]
    assert (
        fuselab(*args, *FAST, "--out", str(out), env={"OMP_NUM_THREADS": str(torch.get_num_threads())}).returncode == 0
    )
    assert_provenance(json.loads(out.read_text())["meta"]["env"])
    (row,) = [json.loads(line) for line in out.with_suffix(".jsonl").read_text().splitlines()]
    assert {"revision", "dirty", "written", "host", "threads", "torch", "triton", "cuda", "gpu"} <= set(row)

    checked = tmp_path / "c.json"
    args = ["check", "gelu", "--impl", "torch", "--dtype", "fp32", "--shape", "100", "--out", str(checked)]
    assert fuselab(*args, env={"OMP_NUM_THREADS": str(torch.get_num_threads())}).returncode == 0
    data = json.loads(checked.read_text())
    assert_provenance(data["meta"]["env"])
    assert {r["status"] for r in data["records"]} == {"pass"}


def test_device_quick_measures_and_its_json_records_its_provenance(fuselab, tmp_path):
    """The one test that has `fuselab device` measure this CPU (--quick measures, whatever the cache holds)."""
    out = tmp_path / "device.json"
    done = fuselab("device", "--quick", "--out", str(out), env={"OMP_NUM_THREADS": str(torch.get_num_threads())})
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert result["quick"] and result["copy_gbps"] > 0 and result["matmul_tflops"]["fp32"] > 0
    assert result["launch_us"] > 0 and result["tiny_kernel_us"] > 0
    assert "copy bandwidth" in done.stdout
    assert_provenance(result["env"])


def test_profile_and_inspect_files_record_their_provenance(fuselab, tmp_path):
    threads = {"OMP_NUM_THREADS": str(torch.get_num_threads())}
    args = ["profile", "gelu", "--impl", "torch", "--shape", "1000", "--iters", "1", "--out", str(tmp_path / "p")]
    assert fuselab(*args, env=threads).returncode == 0
    assert_provenance(json.loads((tmp_path / "p" / "table.json").read_text())["env"])

    from fuselab.profile.inspect import Inspection  # what `fuselab inspect` writes (compiling takes 17 s here)

    Inspection(op="gelu", impl="triton", arch="sm_90", kernels=[]).write(tmp_path / "i")
    assert_provenance(json.loads((tmp_path / "i" / "inspect.json").read_text())["env"])
