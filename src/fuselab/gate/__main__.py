"""`python -m fuselab.gate [--out FILE] [--budget-s S]`: run the GPU gate, write its record, exit 1 on any failure
(2 when there is no GPU). The GPU test suite runs in a child process beside the other stages' jobs
(fuselab.gate.jobs), each in a process of its own."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from fuselab.bench.env import now as _now
from fuselab.bench.env import revision as env_revision
from fuselab.gate.pytest_log import LOG_VARIABLE
from fuselab.gate.record import GROUPS, Check, GateRecord, gpu_folder, source_digest

ROOT = Path(__file__).resolve().parents[3]  # the repository: src/fuselab/gate -> .


def revision() -> str:
    """The tree's git commit (fuselab.bench.env.revision: FUSELAB_REVISION where given, else git's)."""
    return env_revision()[0]


@dataclass
class Suite:
    """The GPU suite's process and the time.monotonic() by which it must have ended."""

    proc: subprocess.Popen
    deadline: float


def start_pytest(log: Path, timeout_s: float, per_test_s: int, workers: int, out: Path) -> Suite:
    """`pytest -m gpu` in a child process (over `workers` pytest-xdist processes where xdist is installed), each
    outcome appended to `log` as it happens, its output to `out`."""
    log.unlink(missing_ok=True)
    env = {**os.environ, LOG_VARIABLE: str(log), "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH", "")) if p)
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "-p", "fuselab.gate.pytest_log",
           "--timeout", str(per_test_s), "-o", "addopts="]  # fmt: skip
    if workers > 1 and importlib.util.find_spec("xdist") is not None:
        cmd += ["-n", str(workers)]
    with out.open("w") as f:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    return Suite(proc, time.monotonic() + timeout_s)


def finish_pytest(suite: Suite, log: Path, budget_s: float) -> list[Check]:
    """Wait for the suite (killed at its deadline); one check per collected test, those without an outcome failed."""
    proc = suite.proc
    try:
        proc.wait(timeout=max(0.0, suite.deadline - time.monotonic()))
        cut = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait()
        cut = True
    collected: list[str] = []
    outcomes: dict[str, Check] = {}
    for line in log.read_text().splitlines() if log.exists() else []:
        record = json.loads(line)
        if "collected" in record:
            collected = record["collected"]
            continue
        outcome = {"passed": "pass", "failed": "fail", "skipped": "skip"}[record["outcome"]]
        detail = record["detail"] + ("" if record["when"] == "call" else f" (in {record['when']})")
        if record["test"] not in outcomes or outcome == "fail":
            outcomes[record["test"]] = Check("pytest", record["test"], outcome, None, detail, record["seconds"])
    checks = [outcomes.get(t) or Check("pytest", t, "fail", None, _unfinished(cut, budget_s)) for t in collected]
    if not collected:
        checks.append(
            Check("pytest", "collection", "fail", None, f"pytest exited {proc.returncode} collecting nothing")
        )
    elif proc.returncode not in (0, 1) and not cut:  # 1: tests failed (listed); else pytest itself broke
        checks.append(Check("pytest", "session", "fail", None, f"pytest exited {proc.returncode}"))
    return checks


def _unfinished(cut: bool, budget_s: float) -> str:
    return f"did not finish: the suite was stopped at the gate's budget of {budget_s:.0f} s" if cut else "no outcome"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fuselab.gate", description=__doc__)
    p.add_argument("--out", type=Path, help="the record (default benchmarks/results/<gpu>/gate.json)")
    p.add_argument("--logs", type=Path, default=Path("gate-logs"), help="folder for pytest's output and tracebacks")
    p.add_argument("--pytest-budget-s", type=float, default=480.0, help="the GPU suite's wall-clock budget")
    p.add_argument("--per-test-s", type=int, default=180, help="one test's limit (pytest-timeout)")
    p.add_argument("--pytest-workers", type=int, default=4, help="pytest-xdist processes for the GPU suite")
    p.add_argument("--workers", type=int, default=6, help="the other stages' jobs run at once")
    p.add_argument("--job-s", type=float, default=400.0, help="one job's limit")
    p.add_argument("--groups", default=",".join(GROUPS), help=f"comma-separated subset of {','.join(GROUPS)}")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("fuselab gate: needs a CUDA GPU; none here", file=sys.stderr)
        return 2
    groups = [g.strip() for g in args.groups.split(",") if g.strip()]
    unknown = sorted(set(groups) - set(GROUPS))
    if unknown:
        p.error(f"unknown group(s) {', '.join(unknown)}; accepted: {', '.join(GROUPS)}")

    from fuselab.bench.env import environment
    from fuselab.gate import jobs

    start = time.monotonic()
    env = environment("cuda")
    out = args.out or ROOT / "benchmarks" / "results" / gpu_folder(str(env["gpu"])) / "gate.json"
    args.logs.mkdir(parents=True, exist_ok=True)
    record = GateRecord(revision(), source_digest(), _now(), env)
    running: Suite | None = None
    outcomes = args.logs / "pytest_outcomes.jsonl"
    os.environ[jobs.LOCK_VARIABLE] = str(args.logs / "gpu_memory.lock")  # the suite's tests past 2^31 take it too
    if "pytest" in groups:
        running = start_pytest(outcomes, args.pytest_budget_s, args.per_test_s, args.pytest_workers,
                            args.logs / "pytest_gpu.log")  # fmt: skip
    lock = threading.Lock()

    def done(job: jobs.Job, checks: list[Check]) -> None:  # progress, and a record that a cut run still leaves
        with lock:
            record.checks += checks
            record.write(out)
            failed = sum(c.outcome == "fail" for c in checks)
            print(f"[{time.monotonic() - start:4.0f} s] {job.name}: {len(checks)} checks, {failed} failed", flush=True)

    ran = jobs.run_all(jobs.plan(groups), args.logs, args.workers, args.job_s, on_done=done)
    tests: list[Check] = []
    if running is not None:
        tests = finish_pytest(running, outcomes, args.pytest_budget_s)
        print(f"[{time.monotonic() - start:4.0f} s] pytest -m gpu: {len(tests)} tests", flush=True)
    ran = tests + ran
    record.checks = ran
    record.seconds = time.monotonic() - start
    record.write(out)
    for group in groups:
        _say(record, group)
    for c in record.failures:
        print(f"FAIL {c.group}: {c.name}: {c.detail}")
    print(f"fuselab gate: {len(record.checks)} checks, {len(record.failures)} failed, {record.seconds:.0f} s; "
          f"wrote {out}")  # fmt: skip
    return 1 if record.failures else 0


def _say(record: GateRecord, group: str) -> None:
    counts = record.counts().get(group, {})
    print(f"gate {group}: {counts.get('pass', 0)} passed, {counts.get('fail', 0)} failed, "
          f"{counts.get('skip', 0)} skipped, {counts.get('upstream', 0)} failed in PyTorch's own kernels")  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
