"""`python -m fuselab.gate [--out FILE] [--budget-s S]`: run the GPU gate, write its record, exit 1 on any failure
(2 when there is no GPU). The GPU test suite runs in a child process while the other stages run here."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from fuselab.gate.pytest_log import LOG_VARIABLE
from fuselab.gate.record import GROUPS, Check, GateRecord, gpu_folder, source_digest

ROOT = Path(__file__).resolve().parents[3]  # the repository: src/fuselab/gate -> .


def revision() -> str:
    """The tree's git commit: FUSELAB_REVISION where given (the GPU machine's copy has no .git), else git's."""
    if os.environ.get("FUSELAB_REVISION"):
        return os.environ["FUSELAB_REVISION"]
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def start_pytest(log: Path, timeout_s: float, per_test_s: int, out: Path) -> subprocess.Popen:
    """`pytest -m gpu` in a child process, each outcome appended to `log` as it happens, its output to `out`."""
    log.unlink(missing_ok=True)
    env = {**os.environ, LOG_VARIABLE: str(log), "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH", "")) if p)
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "-p", "fuselab.gate.pytest_log",
           "--timeout", str(per_test_s), "-o", "addopts="]  # fmt: skip
    with out.open("w") as f:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    proc.deadline = time.monotonic() + timeout_s  # type: ignore[attr-defined]
    return proc


def finish_pytest(proc: subprocess.Popen, log: Path, budget_s: float) -> list[Check]:
    """Wait for the suite (killed at its deadline); one check per collected test, those without an outcome failed."""
    try:
        proc.wait(timeout=max(0.0, proc.deadline - time.monotonic()))  # type: ignore[attr-defined]
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
    p.add_argument("--pytest-budget-s", type=float, default=420.0, help="the GPU suite's wall-clock budget")
    p.add_argument("--per-test-s", type=int, default=180, help="one test's limit (pytest-timeout)")
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
    from fuselab.gate import stages
    from fuselab.ops.registry import all_ops

    start = time.monotonic()
    env = environment("cuda")
    out = args.out or ROOT / "benchmarks" / "results" / gpu_folder(str(env["gpu"])) / "gate.json"
    args.logs.mkdir(parents=True, exist_ok=True)
    log = stages.Log(args.logs / "gate_tracebacks.log")
    record = GateRecord(revision(), source_digest(), _now(), env)
    proc = None
    if "pytest" in groups:
        proc = start_pytest(args.logs / "pytest_outcomes.jsonl", args.pytest_budget_s, args.per_test_s,
                            args.logs / "pytest_gpu.log")  # fmt: skip
    ops = all_ops()
    work = [
        ("check", lambda: [c for op in ops for c in stages.check_rows(op, log)]),
        ("compile", lambda: stages.compile_modules(log) + stages.cs336_step(log)),
        ("model", lambda: stages.drop_in_model(log)),
        ("bench", lambda: [c for op in ops for c in stages.bench_rows(op, log)]),
    ]
    for group, run in work:
        if group in groups:
            t0 = time.monotonic()
            try:
                record.checks += run()
            except Exception as exc:  # a stage's own checks catch what they run; this is the stage itself breaking
                record.checks.append(Check(group, "stage", "fail", None, f"{type(exc).__name__}: {exc}"[:400]))
            _say(record, group, time.monotonic() - t0)
            record.write(out)  # a run cut short keeps what it finished
    if proc is not None:
        record.checks = finish_pytest(proc, args.logs / "pytest_outcomes.jsonl", args.pytest_budget_s) + record.checks
        _say(record, "pytest", time.monotonic() - start)
    record.seconds = time.monotonic() - start
    record.write(out)
    for c in record.failures:
        print(f"FAIL {c.group}: {c.name}: {c.detail}")
    print(f"fuselab gate: {len(record.checks)} checks, {len(record.failures)} failed, {record.seconds:.0f} s; "
          f"wrote {out}")  # fmt: skip
    return 1 if record.failures else 0


def _say(record: GateRecord, group: str, seconds: float) -> None:
    counts = record.counts().get(group, {})
    print(f"gate {group}: {counts.get('pass', 0)} passed, {counts.get('fail', 0)} failed, "
          f"{counts.get('skip', 0)} skipped, {seconds:.0f} s", flush=True)  # fmt: skip


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


if __name__ == "__main__":
    raise SystemExit(main())
