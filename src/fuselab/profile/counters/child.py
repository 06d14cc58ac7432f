"""The child that ncu starts (`python -m fuselab.profile.counters --child SPEC --status STATUS`): the Case record,
each case's warm-ups outside the NVTX range, then its marker and calls inside it."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path

from fuselab.profile.counters.ncu import MARKER_CYCLES, RANGE

# ------------------------------------------------------------------------------------------------ the cases


@dataclass(frozen=True)
class Case:
    """One thing to run under ncu: an op's impl on seeded inputs of `shape`, forward or forward + backward."""

    op: str
    impl: str
    shape: tuple[int, ...]
    dtype: str = "float32"
    options: dict = field(default_factory=dict)
    backward: bool = False

    @property
    def label(self) -> str:
        from fuselab.bench.shapes import format_shape

        dims = format_shape(self.shape)
        opts = "".join(f" {k}={v}" for k, v in sorted(self.options.items()))
        return f"{self.op} {self.impl} {dims} {self.dtype}{opts}{' forward+backward' if self.backward else ''}"


def _child(spec_path: Path, status_path: Path) -> int:
    """Run every case of the spec: warm-ups outside the range, then marker + `iters` calls inside it."""
    import torch

    from fuselab.bench.dtypes import parse_dtype
    from fuselab.ops.registry import get_op
    from fuselab.profile.capture import impl_callable

    spec = json.loads(spec_path.read_text())
    statuses = []
    for raw in spec["cases"]:
        options, backward = raw.get("options") or {}, raw.get("backward", False)
        case = Case(raw["op"], raw["impl"], tuple(raw["shape"]), raw["dtype"], options, backward)
        error = None
        fn = None
        try:
            op = get_op(case.op)
            reason = op.get_impl(case.impl).unavailable("cuda")
            if reason:
                raise RuntimeError(reason)
            fn = impl_callable(
                op, case.impl, case.shape, parse_dtype(case.dtype), "cuda", case.options, backward=case.backward
            )
            for _ in range(spec["warmup"]):
                fn()
            torch.cuda.synchronize()
        except Exception as exc:  # the case is reported as failed; the others still run
            error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
            fn = None
        torch.cuda.nvtx.range_push(RANGE)
        torch.cuda._sleep(MARKER_CYCLES)  # the marker: this case's kernels follow it
        # NVTX ranges are per thread, and autograd runs a CUDA backward on a thread of its own: run it on this one,
        # so that the backward's kernels fall inside the range (outside it ncu would not profile them)
        with torch.autograd.set_multithreading_enabled(False):
            if fn is not None:
                for _ in range(spec["iters"]):
                    fn()
            torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
        statuses.append({"label": case.label, "error": error})
        del fn
        torch.cuda.empty_cache()
    status_path.write_text(json.dumps(statuses, indent=1) + "\n")
    return 0


def _main(argv: list[str] | None = None) -> int:
    from fuselab.profile import counters  # its docstring says how the child is run

    parser = argparse.ArgumentParser(prog="python -m fuselab.profile.counters", description=counters.__doc__)
    parser.add_argument("--child", type=Path, help="(run by ncu) the spec of the cases to run")
    parser.add_argument("--status", type=Path, help="(run by ncu) where the child writes each case's status")
    args = parser.parse_args(argv)
    if args.child is None or args.status is None:
        parser.error("run `fuselab profile OP --counters`; this entry point is the child that ncu starts")
    return _child(args.child, args.status)
