"""The GPU gate's machinery on the CPU: its record, the source digest, the GPU suite's outcomes read back (tests that
never finished named as failures), the plan of jobs over every op x impl, a job that breaks, and the refusal to run
without a GPU. What it checks on a GPU is the GPU's to show (benchmarks/results/<gpu>/gate.json)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fuselab.evaluate import Selection, check_op
from fuselab.gate import jobs, stages
from fuselab.gate.__main__ import Suite, finish_pytest
from fuselab.gate.pytest_log import LOG_VARIABLE
from fuselab.gate.record import GROUPS, Check, GateRecord, gpu_folder, source_digest
from fuselab.ops.registry import Defaults, Op, all_ops

ROOT = Path(__file__).resolve().parents[1]


def test_record_round_trips_and_counts_by_group(tmp_path):
    record = GateRecord("abc123", "d" * 64, "2026-12-01T00:00:00+00:00", {"gpu": "NVIDIA H200"}, 12.5)
    record.checks = [
        Check("check", "gelu triton fp32 1023 contiguous", "pass", 3e-8, "tolerance 1e-05", 0.1),
        Check("check", "attention sdpa fp32 2x1x16 transposed", "upstream", None, "cutlassF: no kernel"),
        Check("pytest", "tests/x.py::test_y", "fail", None, "did not finish"),
        Check("bench", "gelu cuda bf16", "skip", None, "cuda has no backward"),
    ]
    path = tmp_path / "h200" / "gate.json"
    record.write(path)
    back = GateRecord.read(path)
    assert back == record
    data = json.loads(path.read_text())
    assert data["failed"] == 1 and [c.name for c in back.failures] == ["tests/x.py::test_y"]
    assert data["counts"]["check"] == {"pass": 1, "fail": 0, "skip": 0, "upstream": 1}


def test_gpu_folder_is_named_after_the_gpu():
    assert gpu_folder("NVIDIA H200") == "h200"
    assert gpu_folder("NVIDIA H100 80GB HBM3") == "h100_80gb_hbm3"
    assert gpu_folder("NVIDIA GeForce RTX 4090") == "geforce_rtx_4090"


def test_source_digest_follows_the_sources_and_ignores_caches(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("x = 1\n")
    first = source_digest(tmp_path)
    (tmp_path / "pkg" / "__pycache__").mkdir()
    (tmp_path / "pkg" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\0")
    assert source_digest(tmp_path) == first
    (tmp_path / "pkg" / "a.py").write_text("x = 2\n")
    assert source_digest(tmp_path) != first
    assert len(source_digest()) == 64  # the package itself


def _log(path: Path, lines: list[dict]) -> None:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_suite_outcomes_name_tests_that_never_finished(tmp_path):
    log = tmp_path / "outcomes.jsonl"
    _log(log, [
        {"collected": ["t.py::a", "t.py::b", "t.py::c", "t.py::d"]},
        {"test": "t.py::a", "when": "call", "outcome": "passed", "seconds": 0.5, "detail": ""},
        {"test": "t.py::b", "when": "call", "outcome": "failed", "seconds": 0.1, "detail": "AssertionError: 1 != 2"},
        {"test": "t.py::c", "when": "setup", "outcome": "skipped", "seconds": 0.0, "detail": "needs 2 GPUs"},
    ])  # fmt: skip
    done = Suite(subprocess.Popen([sys.executable, "-c", "raise SystemExit(1)"]), deadline=1e18)
    checks = {c.name: c for c in finish_pytest(done, log, budget_s=60)}
    assert [checks[t].outcome for t in ("t.py::a", "t.py::b", "t.py::c", "t.py::d")] == ["pass", "fail", "skip", "fail"]
    assert "1 != 2" in checks["t.py::b"].detail and "in setup" in checks["t.py::c"].detail
    assert checks["t.py::d"].detail == "no outcome"

    slow = Suite(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True), 0.0)
    checks = {c.name: c for c in finish_pytest(slow, log, budget_s=420)}
    assert checks["t.py::d"].outcome == "fail" and "budget of 420 s" in checks["t.py::d"].detail
    assert slow.proc.returncode is not None  # killed, not left running


def test_the_plugin_logs_collection_and_every_outcome(tmp_path):
    (tmp_path / "test_sample.py").write_text(
        "import pytest\n"
        "def test_ok(): pass\n"
        "def test_bad(): assert 1 == 2\n"
        "@pytest.mark.skip(reason='not here')\n"
        "def test_skipped(): pass\n"
    )
    log = tmp_path / "log.jsonl"
    env = {**os.environ, LOG_VARIABLE: str(log), "PYTHONPATH": str(ROOT / "src")}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "fuselab.gate.pytest_log", "-p", "no:cacheprovider",
           "-o", "addopts=", str(tmp_path / "test_sample.py")]  # fmt: skip
    subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, timeout=120)
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(lines[0]["collected"]) == 3
    outcomes = {line["test"].split("::")[1]: line["outcome"] for line in lines[1:]}
    assert outcomes == {"test_ok": "passed", "test_bad": "failed", "test_skipped": "skipped"}


def test_the_plan_covers_every_op_impl_and_layout():
    planned = jobs.plan(list(GROUPS))
    names = {j.name for j in planned}
    for op in all_ops():
        for impl in op.impls:
            for layout in ("contiguous", "transposed", "sliced"):
                assert f"check {op.name} {impl} {layout}" in names
            large = [j for j in planned if j.args == (op.name, impl, "large")]
            assert len(large) == (op.defaults.large_shape is not None) and all(j.exclusive for j in large)
        assert f"bench {op.name}" in names
    assert {"compile modules", "compile FlashAttentionTriton", "compile FlashAttentionTiled"} <= names
    assert {"model fp32", "model bf16"} <= names
    assert len(names) == len(planned)


def test_a_job_that_breaks_is_one_failed_check_naming_it(tmp_path):
    checks = jobs.run_all([jobs.Job("nonsense", ("x",))], tmp_path, workers=1, timeout_s=120)
    assert len(checks) == 1 and checks[0].outcome == "fail" and checks[0].name == "nonsense x"
    assert "exited" in checks[0].detail and "unknown job kind" in checks[0].detail


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="on a GPU the gate would run")
def test_the_gate_refuses_to_run_without_a_gpu():
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run([sys.executable, "-m", "fuselab.gate"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "needs a CUDA GPU" in done.stderr


def test_whole_gpu_memory_has_one_holder_at_a_time(tmp_path, monkeypatch):
    """The lock the gate's jobs past 2^31 elements and the suite's own such tests share: a second holder waits."""
    import threading

    monkeypatch.setenv(jobs.LOCK_VARIABLE, str(tmp_path / "gpu_memory.lock"))
    order: list[str] = []

    def second() -> None:
        with jobs.whole_gpu_memory():
            order.append("second")

    with jobs.whole_gpu_memory():
        waiter = threading.Thread(target=second)
        waiter.start()
        waiter.join(0.5)
        assert waiter.is_alive() and order == [], "the second holder did not wait"
        order.append("first")
    waiter.join(10)
    assert order == ["first", "second"]


def test_whole_gpu_memory_does_nothing_outside_a_gate_run(monkeypatch):
    monkeypatch.delenv(jobs.LOCK_VARIABLE, raising=False)
    with jobs.whole_gpu_memory(), jobs.whole_gpu_memory():  # nested: would deadlock if it locked anything
        pass


def test_a_failed_check_names_the_seed_and_command_that_reproduce_it(monkeypatch):
    op = Op(
        name="toy_cube",
        reference=lambda x: x**3,
        make_inputs=lambda shape, dtype, device, seed: (torch.randn(shape, generator=torch.manual_seed(seed)),),
        bytes_moved=lambda shape, dtype: 0,
        flops=lambda shape: 0,
        tolerance={torch.float32: 1e-6},
        dtypes=(torch.float32,),
        defaults=Defaults(check_shapes=[(33,)]),
    )
    op.impl("wrong")(lambda x: x**3 + 1e-3 * x)
    monkeypatch.setattr(stages, "DTYPES", (torch.float32,))
    (check,) = stages.check_rows(op, "wrong", "transposed", stages.Log(None), device="cpu")
    assert check.outcome == "fail"
    seed = int(re.search(r"--seed (\d+) --layout transposed\)", check.detail).group(1))
    again = Selection(impls=["wrong"], device="cpu", layouts="transposed")
    (row,) = check_op(op, again, seed=seed, show_progress=False)
    assert row.rel_err == pytest.approx(check.figure)  # the same inputs again


def test_the_gpu_suite_starts_with_its_one_longest_test():
    """pytest-xdist hands out tests in consecutive chunks in collection order: the test marked `first` (the quick
    report) is collected first, and only one test is so marked (several would share one worker's chunk)."""
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-o", "addopts="]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}

    def collected(*args: str) -> list[str]:
        out = subprocess.run(cmd + list(args), cwd=ROOT, env=env, capture_output=True, text=True, timeout=300).stdout
        return [line for line in out.splitlines() if "::" in line]

    gpu = collected("-m", "gpu", "tests/bench/test_timer.py", "tests/report/test_report.py")
    assert gpu[0] == "tests/report/test_report.py::test_quick_report_on_the_gpu"
    assert gpu[1].startswith("tests/bench/test_timer.py::") and len(gpu) > 2
    assert collected("-m", "first", "tests") == ["tests/report/test_report.py::test_quick_report_on_the_gpu"]
