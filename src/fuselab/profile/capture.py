"""Profile a callable (or a script) with torch.profiler: warm up first, then record CPU and, with a GPU, CUDA.

result = profile_callable(lambda: f(x), label="f", out_dir="prof/f")
result.trace          # the parsed Chrome trace (fuselab.profile.trace.Trace)
result.trace_path     # prof/f/trace.json: open it in https://ui.perfetto.dev or chrome://tracing
"""

from __future__ import annotations

import contextlib
import os
import runpy
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch.profiler import ProfilerActivity, profile

from fuselab.profile.ranges import range as prange
from fuselab.profile.trace import Trace

if TYPE_CHECKING:  # importing fuselab.ops registers every op; the profiler does not need that to load
    from fuselab.ops.registry import Op, Shape


@dataclass
class ProfileResult:
    """What a profiled run left: the trace (parsed and on disk) and, when asked for, flame-graph stacks."""

    label: str
    trace: Trace
    trace_path: Path
    device: str
    iters: int
    stacks_paths: list[Path] = field(default_factory=list)


@contextlib.contextmanager
def native_stderr_silenced() -> Iterator[None]:
    """Point file descriptor 2 at /dev/null for the block: silences what native code (torch's kineto) prints.
    FUSELAB_DEBUG=1 leaves it alone."""
    if os.environ.get("FUSELAB_DEBUG", "") not in ("", "0"):
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def _synchronize(cuda: bool) -> None:
    if cuda:
        torch.cuda.synchronize()


def profile_callable(
    fn: Callable[[], object],
    *,
    label: str | None = "fn",
    warmup: int = 3,
    iters: int = 5,
    out_dir: str | Path | None = None,
    stacks: bool = False,
    cuda: bool | None = None,
    trace_name: str = "trace.json",
    _stack_retries: int = 3,
) -> ProfileResult:
    """Call `fn()` `warmup` times, then `iters` times under torch.profiler, each call inside range(label).

    cuda: record CUDA activity too (default: when a GPU is available). The trace is written to
    out_dir/trace_name (out_dir a fresh temporary folder when None); with stacks=True also
    stacks_cpu.txt (and stacks_gpu.txt with a GPU): collapsed stacks for flamegraph.pl or speedscope.
    """
    if warmup < 0 or iters < 1:
        raise ValueError(f"need warmup >= 0 and iters >= 1, got warmup={warmup}, iters={iters}")
    cuda = torch.cuda.is_available() if cuda is None else cuda
    for _ in range(warmup):
        fn()
    _synchronize(cuda)

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    options: dict = {"with_stack": True} if stacks else {}
    if stacks:
        from torch._C._profiler import _ExperimentalConfig

        options["experimental_config"] = _ExperimentalConfig(verbose=True)  # keeps the Python frames for stacks
    prof = profile(activities=activities, **options)
    with native_stderr_silenced():  # kineto prints "USDT: ... profiler_start" (and _stop) to stderr
        prof.start()
    try:
        for _ in range(iters):
            if label:
                with prange(label):
                    fn()
            else:
                fn()
        _synchronize(cuda)
    finally:
        with native_stderr_silenced():
            prof.stop()

    out = Path(out_dir) if out_dir is not None else Path(tempfile.mkdtemp(prefix="fuselab-profile-"))
    out.mkdir(parents=True, exist_ok=True)
    trace_path = out / trace_name
    prof.export_chrome_trace(str(trace_path))
    stacks_paths = []
    if stacks:
        metrics = [("cpu", "self_cpu_time_total")] + ([("gpu", "self_cuda_time_total")] if cuda else [])
        for name, metric in metrics:
            path = out / f"stacks_{name}.txt"
            try:
                prof.export_stacks(str(path), metric)
            except UnicodeDecodeError:
                # torch (seen in 2.13 on the CPU, now and then under load) may hand back an event name that is
                # not UTF-8 when stacks are recorded; the stacks of this run are lost, the run itself is not:
                # profile again for them
                if _stack_retries <= 0:
                    raise RuntimeError("torch.profiler returned corrupt event names; stacks not written") from None
                return profile_callable(
                    fn,
                    label=label,
                    warmup=0,
                    iters=iters,
                    out_dir=out,
                    stacks=True,
                    cuda=cuda,
                    trace_name=trace_name,
                    _stack_retries=_stack_retries - 1,
                )
            stacks_paths.append(path)
    return ProfileResult(
        label=label or "run",
        trace=Trace.load(trace_path),
        trace_path=trace_path,
        device="cuda" if cuda else "cpu",
        iters=iters,
        stacks_paths=stacks_paths,
    )


def script_callable(path: str | Path, argv: list[str] | None = None) -> Callable[[], object]:
    """A callable that runs the Python script at `path` as __main__ (sys.argv = [path, *argv])."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such script: {path}")

    def run() -> object:
        saved = sys.argv
        sys.argv = [str(path), *(argv or [])]
        try:
            return runpy.run_path(str(path), run_name="__main__")
        finally:
            sys.argv = saved

    return run


def impl_callable(
    op: Op,
    impl_name: str,
    shape: Shape,
    dtype: torch.dtype,
    device: str,
    options: dict | None = None,
    seed: int = 0,
    backward: bool = False,
) -> Callable[[], object]:
    """A no-argument callable running `op`'s implementation `impl_name` on seeded inputs of `shape` (made once);
    `backward`: forward + backward, as `fuselab bench --backward` times it (the gradients of every floating input
    against one fixed random output gradient).

    Compiled impls are wrapped with torch.compile (the warm-up then compiles them before profiling).
    Raises Unavailable (with the reason) when the impl cannot run on `device` here, or has no backward.
    """
    from fuselab.bench.sweep import Unavailable
    from fuselab.evaluate import prepare, refuse_if_too_big
    from fuselab.evaluate.bench import step_call

    impl = op.get_impl(impl_name)
    if backward and not impl.backward:
        raise Unavailable(f"{impl_name} has no backward")
    fn = prepare(impl, device)
    kwargs = op.resolve_options(options)
    refuse_if_too_big(op, shape, dtype, device, kwargs, reference=False)
    inputs = op.make_inputs(shape, dtype, device, seed, **kwargs)
    return step_call(fn, inputs, kwargs, backward)
