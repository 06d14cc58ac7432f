"""`torchrun -m fuselab bench|check` on two CPU ranks (gloo, loopback, a free port), then a one-rank rerun."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fuselab.bench.distributed import part_files
from fuselab.bench.sweep import load_records
from fuselab.cli import main

SRC = Path(__file__).resolve().parents[2] / "src"
BENCH = ["--impl", "torch,naive", "--device", "cpu", "--dtype", "fp32", "--shape", "3x37", "--shape", "5x41"]
BENCH += ["--shape", "7x29", "--rep-ms", "5", "--warmup-ms", "1", "--rounds", "2"]
GELU = ["gelu", "--impl", "torch,naive", "--device", "cpu", "--dtype", "fp32", "--shape", "2^10", "--shape", "2^12"]
GELU += ["--shape", "2^14", "--rep-ms", "5", "--warmup-ms", "1", "--rounds", "2", "--call-cost-ms", "0"]


def torchrun(*argv: str, cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(SRC), "FUSELAB_CACHE": str(cache), "COLUMNS": "200"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "fuselab"]
    return subprocess.run([*cmd, *argv], capture_output=True, text=True, env=env, timeout=150)


@pytest.mark.timeout(180)
def test_torchrun_bench_and_check_on_two_ranks_then_resume_on_one(tmp_path, cache, monkeypatch, capsys):
    out = tmp_path / "s.json"
    done = torchrun("bench", "softmax", *BENCH, "--out", str(out), cache=cache)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("rel err") == 1  # rank 0 prints the one table
    records = load_records(out.with_suffix(".jsonl"))
    assert sorted((r["impl"], tuple(r["shape"])) for r in records) == sorted(
        (i, s) for i in ("torch", "naive") for s in ((3, 37), (5, 41), (7, 29))
    )
    assert {r["rank"] for r in records} == {0, 1} and all(r["error"] is None for r in records)
    assert part_files(out.with_suffix(".jsonl")) == []

    monkeypatch.setenv("FUSELAB_CACHE", str(cache))
    assert main(["bench", "softmax", *BENCH, "--out", str(out)]) == 0  # one rank, the same log: all done
    assert len(load_records(out.with_suffix(".jsonl"))) == 6

    check = ["check", "softmax", "--impl", "torch,naive", "--device", "cpu", "--shape", "3x37", "--seed", "5"]
    checked = torchrun(*check, cache=cache)
    assert checked.returncode == 0, checked.stderr[-3000:]
    assert checked.stdout.count("max rel err") == 1 and "0 failed" in checked.stdout
    table = [line for line in checked.stdout.splitlines() if line.startswith("│")]
    assert len(table) == 6  # one row per impl and dtype (2 x 3), not one per rank


@pytest.mark.timeout(180)
def test_two_cpu_ranks_measure_each_case_once_and_a_rerun_adds_no_row(tmp_path, cache):
    """Issue 28's command: gelu has two forms (approximate tanh and none), so 2 impls x 3 sizes x 2 forms = 12
    cases; each is measured by one rank, the merged log has one row per case naming its rank, and the same command
    run again measures nothing (the log is unchanged) and says so."""
    out = tmp_path / "r.json"
    log = out.with_suffix(".jsonl")
    first = torchrun("bench", *GELU, "--out", str(out), cache=cache)
    assert first.returncode == 0, first.stderr[-3000:]
    rows = load_records(log)
    cases = {(i, n, a) for i in ("torch", "naive") for n in (2**10, 2**12, 2**14) for a in ("tanh", "none")}
    assert len(rows) == len(cases) == 12
    assert {(r["impl"], r["shape"][0], r["approximate"]) for r in rows} == cases  # one row per case
    assert len({r["key"] for r in rows}) == 12
    assert {r["rank"] for r in rows} == {0, 1} and all(r["error"] is None for r in rows)
    assert re.search(r"bench gelu: 12 cases to run over 2 ranks \(\d+ on rank 0, \d+ on rank 1\)", first.stderr)
    assert "bench gelu [rank 0: " in first.stderr  # rank 0's progress counts its share, and says so
    assert part_files(log) == []

    again = torchrun("bench", *GELU, "--out", str(out), cache=cache)
    assert again.returncode == 0, again.stderr[-3000:]
    assert load_records(log) == rows  # nothing measured again, no row added
    assert f"resuming {log}: 12 of 12 cases done, 0 to run" in again.stderr
    assert "cases to run over" not in again.stderr and part_files(log) == []
