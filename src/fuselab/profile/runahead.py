"""The run-ahead study: how far the CPU gets ahead of the GPU, and what a print of the loss does to it.

CUDA calls are asynchronous: the CPU queues kernels and goes on, so in a training loop it can be several steps
ahead of the GPU. Anything that needs a result on the CPU (`loss.item()`, printing a tensor, `.cpu()`) makes it
wait for the GPU to catch up. The study runs an MLP training loop twice, plainly and with `print(loss.item())`
each step, and reads from each trace:

- for every kernel, the lag from its launch (CPU) to its start (GPU), in ms, and in steps: the step the CPU
  was issuing when the kernel started minus the step that launched it;
- per step, when the CPU finished issuing it and when the GPU finished running it;
- the synchronizations (and what the print added), and the wall time of each loop (timed apart, unprofiled).
"""

from __future__ import annotations

import bisect
import json
import re
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TextIO

import torch
from torch import nn

from fuselab.bench.dtypes import dtype_name
from fuselab.profile.capture import profile_callable
from fuselab.profile.ranges import range as prange
from fuselab.profile.timeline import render_timeline
from fuselab.profile.trace import RANGE, Event, Trace

STEP = re.compile(r"^step (\d+)$")


@dataclass
class MLPConfig:
    """An MLP of `layers` Linear(dim, dim) (ReLU between), trained with SGD on a fixed random batch.

    dim and batch default by device: 2048 on a GPU (a few ms of GPU work per step, far more than the CPU needs
    to issue it, so the CPU runs ahead), 128 on the CPU.
    """

    steps: int = 20
    layers: int = 4
    dim: int | None = None
    batch: int | None = None
    lr: float = 1e-3
    device: str | None = None
    dtype: torch.dtype = torch.float32
    seed: int = 0

    def resolved(self) -> MLPConfig:
        device = self.device or ("cuda" if torch.cuda.is_available() else "cpu")
        size = 2048 if device.startswith("cuda") else 128
        if self.steps < 1 or self.layers < 1:
            raise ValueError(f"steps and layers must be >= 1, got steps={self.steps}, layers={self.layers}")
        return MLPConfig(
            self.steps, self.layers, self.dim or size, self.batch or size, self.lr, device, self.dtype, self.seed
        )


def make_mlp(cfg: MLPConfig) -> tuple[nn.Module, torch.optim.Optimizer, torch.Tensor, torch.Tensor]:
    """(model, optimizer, inputs (batch, dim), targets (batch, dim)), seeded."""
    cfg = cfg.resolved()
    gen = torch.Generator().manual_seed(cfg.seed)
    mods: list[nn.Module] = []
    for i in range(cfg.layers):
        mods.append(nn.Linear(cfg.dim, cfg.dim))
        if i < cfg.layers - 1:
            mods.append(nn.ReLU())
    model = nn.Sequential(*mods)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) / cfg.dim**0.5)
    model = model.to(cfg.device, cfg.dtype)
    x = torch.randn(cfg.batch, cfg.dim, generator=gen).to(cfg.device, cfg.dtype)
    y = torch.randn(cfg.batch, cfg.dim, generator=gen).to(cfg.device, cfg.dtype)
    return model, torch.optim.SGD(model.parameters(), lr=cfg.lr), x, y


def train(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    steps: int,
    *,
    print_loss: bool = False,
    file: TextIO | None = None,
) -> torch.Tensor:
    """`steps` SGD steps, each inside range("step N"); with print_loss, print(loss.item()) every step."""
    loss = torch.zeros(())
    for i in range(steps):
        with prange(f"step {i}"):
            opt.zero_grad(set_to_none=True)
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            if print_loss:
                print(f"step {i} loss {loss.item():.6f}", file=file, flush=True)
    return loss


# analysis of a trace


@dataclass
class StepTiming:
    """One training step; times in ms from the start of the trace (GPU fields None without GPU work)."""

    step: int
    cpu_start: float
    cpu_end: float
    gpu_start: float | None = None
    gpu_end: float | None = None
    kernels: int = 0

    @property
    def gpu_behind_ms(self) -> float | None:
        """How long after the CPU finished issuing this step the GPU finished running it."""
        return None if self.gpu_end is None else self.gpu_end - self.cpu_end


@dataclass
class RunAheadAnalysis:
    """What a trace says about the CPU running ahead of the GPU. Lags in ms; steps as counted by ranges."""

    has_gpu: bool
    steps: list[StepTiming]
    launches: int = 0  # GPU events whose launch fell inside a step
    lag_ms_median: float | None = None
    lag_ms_max: float | None = None
    steps_ahead_max: int | None = None
    steps_ahead_median: float | None = None
    syncs: dict[str, int] = field(default_factory=dict)
    sync_wait_ms: float = 0.0  # CPU time spent inside the synchronizing calls
    host_reads: int = 0  # aten::item calls: each makes the CPU wait for the GPU (on the CPU it costs nothing)
    span_ms: float = 0.0
    note: str = ""

    def to_json(self) -> dict:
        return {**asdict(self), "steps": [{**asdict(s), "gpu_behind_ms": s.gpu_behind_ms} for s in self.steps]}


def step_ranges(trace: Trace) -> list[tuple[int, Event]]:
    """The CPU-side ranges named 'step N', as (N, event), by start time."""
    out = [(int(m.group(1)), e) for e in trace.of(RANGE) if (m := STEP.match(e.name))]
    return sorted(out, key=lambda s: s[1].ts)


def analyze_runahead(trace: Trace) -> RunAheadAnalysis:
    """Launch-to-start lags, steps ahead, per-step CPU/GPU timing and syncs, from a trace of `train`."""
    ranges = step_ranges(trace)
    syncs: dict[str, int] = {}
    for s in trace.syncs():
        syncs[s.kind] = syncs.get(s.kind, 0) + 1
    result = RunAheadAnalysis(
        has_gpu=trace.has_gpu,
        steps=[StepTiming(n, trace.ms(e.ts), trace.ms(e.end)) for n, e in ranges],
        syncs=syncs,
        sync_wait_ms=sum(s.dur for s in trace.syncs()) / 1000.0,
        host_reads=sum(e.name == "aten::item" for e in trace.ops),
        span_ms=(trace.end - trace.start) / 1000.0,
    )
    if not ranges:
        result.note = "no 'step N' ranges in this trace: was it recorded from fuselab.profile.runahead.train?"
        return result
    if not trace.has_gpu:
        result.note = "no GPU in this trace: the CPU runs every op itself, so there is nothing to run ahead of"
        return result

    starts = [e.ts for _, e in ranges]
    by_step = {st.step: st for st in result.steps}
    lags, ahead = [], []
    for launch, work in trace.launches():
        i = _index_at(starts, launch.ts)
        if i is None or launch.ts > ranges[i][1].end:
            continue  # launched outside any step (e.g. our final synchronize)
        step = ranges[i][0]
        st = by_step[step]
        start, end = trace.ms(work.ts), trace.ms(work.end)
        st.kernels += 1
        st.gpu_start = start if st.gpu_start is None else min(st.gpu_start, start)
        st.gpu_end = end if st.gpu_end is None else max(st.gpu_end, end)
        lags.append((work.ts - launch.ts) / 1000.0)
        cpu_now = _index_at(starts, work.ts)  # the step the CPU was in (or had last begun) when the kernel started
        ahead.append(ranges[cpu_now][0] - step)
    result.launches = len(lags)
    if lags:
        result.lag_ms_median = statistics.median(lags)
        result.lag_ms_max = max(lags)
        result.steps_ahead_max = max(ahead)
        result.steps_ahead_median = statistics.median(ahead)
    else:
        result.note = "no GPU work was launched inside the steps"
    return result


def _index_at(starts: list[float], ts: float) -> int | None:
    i = bisect.bisect_right(starts, ts) - 1
    return i if i >= 0 else None


# the study


@dataclass
class RunAheadRun:
    """One variant of the loop: its wall time (unprofiled), the analysis of its trace, and its files."""

    name: str
    wall_ms: float
    analysis: RunAheadAnalysis
    trace_path: Path
    timeline_path: Path

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "wall_ms": self.wall_ms,
            "trace": str(self.trace_path),
            "timeline": str(self.timeline_path),
            "analysis": self.analysis.to_json(),
        }


@dataclass
class RunAheadStudy:
    config: MLPConfig
    runs: list[RunAheadRun]

    @property
    def added_syncs(self) -> dict[str, int]:
        """Syncs in the printing run minus those in the plain run, by kind."""
        plain, printed = self.runs[0].analysis.syncs, self.runs[1].analysis.syncs
        kinds = sorted(set(plain) | set(printed))
        return {k: printed.get(k, 0) - plain.get(k, 0) for k in kinds if printed.get(k, 0) != plain.get(k, 0)}

    def to_json(self) -> dict:
        cfg = asdict(self.config)
        cfg["dtype"] = dtype_name(self.config.dtype)
        return {"config": cfg, "runs": [r.to_json() for r in self.runs], "added_syncs": self.added_syncs}

    def summary(self) -> str:
        """A few lines a reader can take in at once."""
        c = self.config
        lines = [f"MLP {c.layers} x Linear({c.dim}, {c.dim}), batch {c.batch}, {c.steps} steps on {c.device}"]
        for r in self.runs:
            a = r.analysis
            lines.append(f"  {r.name:<6} wall {r.wall_ms:.2f} ms (unprofiled)")
            if a.lag_ms_max is not None:
                lines.append(
                    f"         kernel start - launch: median {a.lag_ms_median:.3f} ms, max {a.lag_ms_max:.3f} ms;"
                    f" the CPU was up to {a.steps_ahead_max} step(s) ahead"
                )
            syncs = ", ".join(f"{n} x{k}" for n, k in sorted(a.syncs.items())) or "none"
            lines.append(f"         syncs: {syncs} (CPU waited {a.sync_wait_ms:.2f} ms); .item() calls: {a.host_reads}")
            if a.note:
                lines.append(f"         {a.note}")
        added = ", ".join(f"{k} +{n}" for k, n in self.added_syncs.items()) or "none"
        plain, printed = self.runs[0], self.runs[1]
        lines.append(f"  the print added: {added}; wall {plain.wall_ms:.2f} -> {printed.wall_ms:.2f} ms")
        return "\n".join(lines)


def _wall_ms(fn, cuda: bool) -> float:
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    if cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1000.0


def run_runahead(cfg: MLPConfig, out_dir: str | Path, *, warmup_steps: int = 3) -> RunAheadStudy:
    """Run the loop plainly and with a print each step; write per variant trace_<name>.json and
    timeline_<name>.png (and the printed losses to loss_print.txt), plus runahead.json and summary.txt, into
    out_dir."""
    cfg = cfg.resolved()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cuda = cfg.device.startswith("cuda")
    runs = []
    with open(out / "loss_print.txt", "w") as log:
        for name, printing in (("plain", False), ("print", True)):
            model, opt, x, y = make_mlp(cfg)

            def loop(model=model, opt=opt, x=x, y=y, printing=printing) -> None:
                train(model, opt, x, y, cfg.steps, print_loss=printing, file=log)

            train(model, opt, x, y, warmup_steps, print_loss=printing, file=log)
            wall = _wall_ms(loop, cuda)
            result = profile_callable(
                loop, label=None, warmup=0, iters=1, out_dir=out, cuda=cuda, trace_name=f"trace_{name}.json"
            )
            trace = result.trace
            analysis = analyze_runahead(trace)
            title = f"{name}: {cfg.steps} steps, MLP {cfg.layers}x{cfg.dim}, batch {cfg.batch}, wall {wall:.1f} ms"
            if analysis.steps_ahead_max is not None:
                title += f"; the CPU ran up to {analysis.steps_ahead_max} step(s) ahead"
            timeline = render_timeline(trace, out / f"timeline_{name}.png", title=title)
            runs.append(RunAheadRun(name, wall, analysis, result.trace_path, timeline))
    study = RunAheadStudy(cfg, runs)
    (out / "runahead.json").write_text(json.dumps(study.to_json(), indent=1) + "\n")
    (out / "summary.txt").write_text(study.summary() + "\n")
    return study
