"""Running cases end to end: profile_counters and run_cases (one ncu run, each case assessed), their result,
study_shapes (a large and a small shape for any op) and affordable_shape (which of them an impl
is profiled at)."""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fuselab.bench.env import provenance
from fuselab.profile.counters.child import Case
from fuselab.profile.counters.ncu import CountersUnavailable, counters_unavailable, run_ncu
from fuselab.profile.counters.verdicts import assess_case, bytes_line, split_by_marker

if TYPE_CHECKING:
    import torch

    from fuselab.ops.registry import Op


@dataclass
class CountersResult:
    """What profile_counters measured: one assessed row per case, where the files are, how ncu was read."""

    rows: list[dict]
    out_dir: Path
    source: str  # "ncu_report" or "csv"

    def text(self) -> str:
        lines = []
        for row in self.rows:
            lines.append(f"{row['label']}: {bytes_line(row) if not row.get('error') else row['error']}")
            for k in row.get("kernels", []):
                lines.append(f"  {k['short_name'][:60]:60s} {k['dram_bytes'] / 1e6:9.4g} MB  {k['verdict']}")
        return "\n".join(lines)

    def to_json(self) -> dict:
        report = str(self.out_dir / "counters.ncu-rep")
        return {"source": self.source, "report": report, "rows": self.rows, "env": provenance("cuda")}


def profile_counters(
    op: Op | str,
    impls: Iterable[str] | None = None,
    shape: Sequence[int] | None = None,
    dtype: torch.dtype | str = "float32",
    options: dict | None = None,
    *,
    out_dir: str | Path | None = None,
    warmup: int = 2,
    iters: int = 1,
    kernel_regex: str | None = None,
    backward: bool = False,
) -> CountersResult:
    """Run `op`'s impls (default: all) at `shape` (default: its first bench shape) under ncu, forward or (`backward`)
    forward + backward; assess each.

    Raises CountersUnavailable (one line) where counters cannot be read: no GPU, no ncu, not permitted.
    Impls unavailable here (no nvcc, no Triton) come back as rows with their error.
    """
    from fuselab.bench.dtypes import dtype_name, parse_dtype
    from fuselab.ops.registry import get_op

    reason = counters_unavailable("cuda")
    if reason:
        raise CountersUnavailable(reason)
    op = get_op(op) if isinstance(op, str) else op
    names = list(impls) if impls else list(op.impls)
    for name in names:
        op.get_impl(name)
    shape = tuple(shape) if shape is not None else tuple(op.defaults.bench_shapes[0])
    dtype = dtype if isinstance(dtype, str) else dtype_name(dtype)
    dtype = dtype_name(parse_dtype(dtype))
    cases = [Case(op.name, name, shape, dtype, dict(options or {}), backward) for name in names]
    return run_cases(cases, out_dir=out_dir, warmup=warmup, iters=iters, kernel_regex=kernel_regex)


def run_cases(
    cases: Sequence[Case],
    *,
    out_dir: str | Path | None = None,
    warmup: int = 2,
    iters: int = 1,
    kernel_regex: str | None = None,
) -> CountersResult:
    """Profile any cases (of any ops) in one ncu run and assess each; see profile_counters."""
    if warmup < 0 or iters < 1:
        raise ValueError(f"need warmup >= 0 and iters >= 1, got warmup={warmup}, iters={iters}")
    out = Path(out_dir) if out_dir is not None else Path(tempfile.mkdtemp(prefix="fuselab-counters-"))
    kernels, statuses, source = run_ncu(cases, out, warmup=warmup, iters=iters, kernel_regex=kernel_regex)
    groups = split_by_marker(kernels, len(cases))
    errors = [s.get("error") for s in statuses] if len(statuses) == len(cases) else [None] * len(cases)
    rows = [assess_case(c, g, iters, e) for c, g, e in zip(cases, groups, errors, strict=True)]
    result = CountersResult(rows=rows, out_dir=out, source=source)
    (out / "counters.json").write_text(json.dumps(result.to_json(), indent=1, default=str) + "\n")
    return result


def study_shapes(op: Op) -> list[tuple[int, ...]]:
    """A large and a small shape for any op, by rule: the middle bench shape, and it with its first dimension of at
    least 256 (the leading one for gelu and softmax; attention's sequence length, its batch being 1) / 256 + 1."""
    large = tuple(op.defaults.bench_shapes[len(op.defaults.bench_shapes) // 2])
    i = next((i for i, n in enumerate(large) if n >= 256), 0)
    small = (*large[:i], large[i] // 256 + 1, *large[i + 1 :])
    return [large, small]


def affordable_shape(
    op: Op, impl: str, shapes: Sequence[tuple[int, ...]], device: str, max_call_ms: float, dtype: str = "float32"
) -> int:
    """The index of the first of `shapes` at which one plain call of `impl` (in `dtype`, default options) takes at most
    `max_call_ms`, else the last one's: ncu replays each kernel of a call many times over, so a call of seconds (a
    teaching impl's Python loop over blocks launches thousands of kernels) would hold it for hours. A call over the
    bound is timed a second time (the first may have compiled) before the next shape is tried. An impl that refuses
    the call (unavailable here in `dtype`, or Unavailable raised by the call: cuDNN has no float32 attention) gets
    the last shape: ncu's child reports its refusal."""
    import torch

    from fuselab.bench.dtypes import parse_dtype
    from fuselab.bench.sweep import Unavailable

    declared, torch_dtype = op.get_impl(impl), parse_dtype(dtype)
    if declared.unavailable(device, torch_dtype):
        return len(shapes) - 1
    fn, options = declared.fn, op.default_options()
    on_gpu = torch.device(device).type == "cuda"
    for i, shape in enumerate(shapes[:-1]):
        inputs = op.make_inputs(tuple(shape), torch_dtype, device, 0, **options)
        for _ in range(2):
            if on_gpu:
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            try:
                fn(*inputs, **options)
            except Unavailable:
                return len(shapes) - 1
            if on_gpu:
                torch.cuda.synchronize(device)
            if (time.perf_counter() - start) * 1e3 <= max_call_ms:
                return i
        del inputs
        if on_gpu:
            torch.cuda.empty_cache()
    return len(shapes) - 1
