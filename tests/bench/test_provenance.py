"""Every results file says what measured it: the git revision (and whether the tree was dirty), host, threads, time."""

from __future__ import annotations

import datetime
import os
import re
import subprocess
from pathlib import Path

import torch

from fuselab.bench.env import ROOT, provenance


def test_provenance_names_the_revision_host_threads_and_time(monkeypatch) -> None:
    monkeypatch.delenv("FUSELAB_REVISION", raising=False)
    p = provenance("cpu")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    if head.returncode == 0:  # a checkout: git's own answer
        assert p["revision"] == head.stdout.strip() and isinstance(p["dirty"], bool)
    else:
        assert p["revision"] == "unknown"
    assert p["threads"] == torch.get_num_threads() and p["host"] and p["torch"] == torch.__version__
    assert datetime.datetime.fromisoformat(p["written"]).tzinfo is not None
    monkeypatch.setenv("FUSELAB_REVISION", "abc1234")  # a copy without .git, as on the GPU machine
    q = provenance("cpu")
    assert q["revision"] == "abc1234" and q["dirty"] is None
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", q["fuselab"])


def test_provenance_names_the_cpu_and_its_clock_where_readable(monkeypatch) -> None:
    p = provenance("cpu")
    assert p["cpu_model"] and p["cuda"] == torch.version.cuda and "gpu" in p and "triton" in p
    cpuinfo = Path("/proc/cpuinfo")
    readable = cpuinfo.exists() and any(line.startswith("cpu MHz") for line in cpuinfo.read_text().splitlines())
    if readable:
        assert p["clocks"]["cpu_mhz"] > 0
    else:
        assert p["clocks"] is None


def test_gpu_clocks_are_read_from_nvidia_smi_current_and_max(tmp_path, monkeypatch) -> None:
    """SM and memory clocks, [current, max] MHz, as nvidia-smi prints them (a stand-in on PATH here); None when
    nvidia-smi is missing or says nothing."""
    from fuselab.bench import env

    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '1755, 1980, 2619, 3201'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert env.gpu_clocks() == {"sm_mhz": [1755, 1980], "memory_mhz": [2619, 3201]}
    smi.write_text("#!/bin/sh\nexit 9\n")
    assert env.gpu_clocks() is None
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    assert env.gpu_clocks() is None


def test_each_row_of_a_log_says_what_measured_it_and_when(monkeypatch) -> None:
    """A log's rows outlive a run (a resumed log mixes runs): each carries its revision, host, threads and time."""
    from fuselab.bench.env import row_provenance

    monkeypatch.setenv("FUSELAB_REVISION", "abc1234")
    row = row_provenance("cpu")
    assert row["revision"] == "abc1234" and row["dirty"] is None
    assert row["threads"] == torch.get_num_threads() and row["host"] and row["device"] == "cpu"
    assert set(row) >= {"gpu", "torch", "triton", "cuda"}
    assert datetime.datetime.fromisoformat(row["written"]).tzinfo is not None
