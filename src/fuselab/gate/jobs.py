"""The gate's work as jobs, each run in a process of its own (`python -m fuselab.gate.jobs KIND ARG... --out FILE`),
several at once: a kernel that leaves the CUDA context broken (a misaligned address is sticky) spoils only its own
job's remaining checks, never the rest of the gate."""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from fuselab.gate.record import Check

LOCK_VARIABLE = "FUSELAB_GATE_MEMORY_LOCK"  # the file the gate locks for work that needs most of the GPU's memory


@dataclass(frozen=True)
class Job:
    """One unit of the gate. kind: check (args: op, impl, layout), compile (args: "modules" or a CS336 class),
    model (args: fp32 or bf16) or bench (args: op).
    exclusive: it needs most of the GPU's memory (a shape past 2^31 elements): it runs holding whole_gpu_memory()."""

    kind: str
    args: tuple[str, ...] = ()
    exclusive: bool = False

    @property
    def name(self) -> str:
        return " ".join((self.kind, *self.args))


def plan(groups: list[str]) -> list[Job]:
    """The jobs of these groups over every registered op and impl, the longest first."""
    from fuselab.gate.stages import LAYOUTS
    from fuselab.ops.registry import all_ops

    jobs: list[Job] = []
    if "check" in groups:
        for op in all_ops():
            jobs += [Job("check", (op.name, impl, layout)) for impl in op.impls for layout in LAYOUTS]
            if op.defaults.large_shape is not None:
                jobs += [Job("check", (op.name, impl, "large"), exclusive=True) for impl in op.impls]
    if "compile" in groups:
        jobs += [Job("compile", (what,)) for what in ("modules", "FlashAttentionTriton", "FlashAttentionTiled")]
    if "model" in groups:
        jobs += [Job("model", (dtype,)) for dtype in ("fp32", "bf16")]
    if "bench" in groups:
        jobs += [Job("bench", (op.name,)) for op in all_ops()]
    first = ("attention",)  # the longest: its checks compile and run the most kernels
    return sorted(jobs, key=lambda j: (j.args[:1] != first, j.kind not in ("compile", "model"), "triton" not in j.args))


def run(job: Job, log_path: Path | None) -> list[Check]:
    """The job's checks (in this process)."""
    from fuselab.gate import stages
    from fuselab.ops.registry import get_op

    log = stages.Log(log_path)
    if job.kind == "check":
        op, impl, layout = job.args
        return stages.check_rows(get_op(op), impl, layout, log)
    if job.kind == "compile":
        return stages.compile_modules(log) if job.args == ("modules",) else stages.cs336_step(job.args[0], log)
    if job.kind == "model":
        return stages.drop_in_model(job.args[0], log)
    if job.kind == "bench":
        return stages.bench_rows(get_op(job.args[0]), log)
    raise ValueError(f"unknown job kind {job.kind!r}")


def run_all(
    jobs: list[Job],
    logs: Path,
    workers: int,
    timeout_s: float,
    on_done: Callable[[Job, list[Check]], None] | None = None,
) -> list[Check]:
    """Run every job in a child process, `workers` at once beside the exclusive jobs (one at a time, in a line of
    their own, each holding whole_gpu_memory()), each within `timeout_s`; a job that crashes or runs out of time is
    one failed check naming it. on_done(job, checks) after each."""
    results: dict[Job, list[Check]] = {}

    def one(job: Job) -> None:
        results[job] = _child(job, logs, timeout_s)
        if on_done is not None:
            on_done(job, results[job])

    def in_line(line: list[Job]) -> None:
        for job in line:
            with whole_gpu_memory():
                one(job)

    with ThreadPoolExecutor(max_workers=workers + 1) as pool:
        line = pool.submit(in_line, [j for j in jobs if j.exclusive])
        list(pool.map(one, [j for j in jobs if not j.exclusive]))
        line.result()
    return [c for job in jobs for c in results[job]]


@contextlib.contextmanager
def whole_gpu_memory() -> Iterator[None]:
    """Hold the gate's lock on most of the GPU's memory: an exclusive lock on the file $FUSELAB_GATE_MEMORY_LOCK,
    taken by the gate's jobs past 2^31 elements and by the GPU suite's own such tests (the `whole_gpu_memory`
    fixture), so no two of them fill the GPU at once. Without the variable (outside a gate run) it does nothing."""
    path = os.environ.get(LOCK_VARIABLE)
    if not path:
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _child(job: Job, logs: Path, timeout_s: float) -> list[Check]:
    slug = "-".join((job.kind, *job.args)).replace("/", "_")
    out, err = logs / "jobs" / f"{slug}.json", logs / "jobs" / f"{slug}.log"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "fuselab.gate.jobs", job.kind, *job.args, "--out", str(out),
           "--log", str(logs / "gate_tracebacks.log")]  # fmt: skip
    start = time.monotonic()
    group = "check" if job.kind == "check" else job.kind
    with err.open("w") as f:
        try:
            done = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout_s, env=os.environ.copy())
        except subprocess.TimeoutExpired:
            return [Check(group, job.name, "fail", None, f"did not finish within {timeout_s:.0f} s", timeout_s)]
    if out.exists():
        return [Check(**c) for c in json.loads(out.read_text())]
    tail = [line for line in err.read_text().splitlines() if line.strip()][-1:] or [""]
    seconds = time.monotonic() - start
    detail = f"the job's process exited {done.returncode}: {tail[0][:300]}"
    return [Check(group, job.name, "fail", None, detail, seconds)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fuselab.gate.jobs")
    p.add_argument("kind")
    p.add_argument("args", nargs="*")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--log", type=Path)
    a = p.parse_args(argv)
    checks = run(Job(a.kind, tuple(a.args)), a.log)
    a.out.write_text(json.dumps([asdict(c) for c in checks]) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
