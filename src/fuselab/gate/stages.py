"""The gate's stages after the GPU test suite, each a list of `Check`s: every op x impl checked against float64 (edge
shapes, three layouts, a shape past 2^31 elements), every fuselab.nn module compiled fullgraph with its default
arguments, the CS336 classes' leaderboard step compiled, a model of drop-ins against its torch.nn twin, and a short
bench of every op x impl."""

from __future__ import annotations

import math
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from fuselab.bench.accuracy import gradient_error, relative_error
from fuselab.bench.dtypes import dtype_name, parse_dtype, short_name
from fuselab.bench.record import Verdict
from fuselab.bench.shapes import format_shape
from fuselab.bench.timer import Timing
from fuselab.evaluate import Selection, bench_op, check_op, fresh_seed
from fuselab.gate.record import Check
from fuselab.ops.registry import Op, all_ops

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
LAYOUTS = ("contiguous", "transposed", "sliced")  # strided views: a non-unit last stride, rows of an odd stride
LARGE_DTYPES = (torch.float32, torch.bfloat16)
BENCH_TIMING = Timing(warmup_ms=2.0, min_warmup=1, rep_ms=5.0, min_reps=3, max_reps=20, flush_l2=False)


class Log:
    """Where the stages write what a one-line detail cannot hold (tracebacks), one file per run."""

    def __init__(self, path: Path | None) -> None:
        self.path = path

    def write(self, title: str, text: str) -> None:
        if self.path is not None:
            with self.path.open("a") as f:
                f.write(f"\n===== {title}\n{text}\n")


@contextmanager
def attempt(checks: list[Check], group: str, name: str, log: Log) -> Iterator[dict]:
    """Run the block as one check: it fills `result` (figure, detail, outcome); an exception is a failure whose
    traceback goes to the log and whose last line is the detail."""
    result: dict = {}
    start = time.perf_counter()
    try:
        yield result
        outcome = result.get("outcome", "pass")
    except Exception as exc:
        log.write(f"{group} {name}", traceback.format_exc())
        outcome = "fail"
        result["detail"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"[:400]
    finally:
        torch._dynamo.reset()
        torch.cuda.empty_cache()
    checks.append(
        Check(group, name, outcome, result.get("figure"), result.get("detail", ""), time.perf_counter() - start)
    )


def _error_check(err: float, tol: float, what: str) -> dict:
    ok = math.isfinite(err) and err <= tol
    return {"figure": err, "outcome": "pass" if ok else "fail", "detail": f"{what}; tolerance {tol:g}"}


# ---------------------------------------------------------------------------------------------- check


def check_rows(op: Op, impl: str, layout: str, log: Log, device: str = "cuda") -> list[Check]:
    """`fuselab check` of one impl of `op` on the GPU in fp32, fp16 and bf16: its check shapes in `layout`, or, for
    layout "large", its large shape (forward only, fp32 and bf16). A failure of an upstream impl (PyTorch's own
    kernels) is reported as such."""
    if layout == "large":
        chosen = Selection(impls=[impl], dtypes=LARGE_DTYPES, shapes=[op.defaults.large_shape], device=device)
    else:
        chosen = Selection(impls=[impl], dtypes=DTYPES, device=device, layouts=(layout,))
    upstream = op.get_impl(impl).upstream
    seed = fresh_seed()  # fresh inputs each gate; a failure names the seed that reproduces it
    again = f"seed {seed}: fuselab check {op.name} --impl {impl} --seed {seed}"
    again += f" --layout {layout}" if layout not in ("contiguous", "large") else ""
    start = time.perf_counter()
    try:
        rows = check_op(op, chosen, seed=seed, grad=layout != "large", show_progress=False)
    except Exception as exc:
        log.write(f"check {op.name} {impl} {layout}", traceback.format_exc())
        outcome = "upstream" if upstream else "fail"
        return [Check("check", f"{op.name} {impl} {layout}", outcome, None, f"{type(exc).__name__}: {exc}"[:400])]
    seconds = (time.perf_counter() - start) / max(len(rows), 1)
    checks: list[Check] = []
    for r in rows:
        options = " ".join(f"{k}={v}" for k, v in r.case.options)
        name = f"{op.name} {impl} {short_name(r.case.dtype)} {format_shape(r.case.shape)} {layout}"
        name += f" {options}" if options else ""
        errors = [e for e in (r.rel_err, r.grad_rel_err) if e is not None]
        outcome = {"pass": "pass", "FAIL": "upstream" if upstream else "fail"}.get(str(r.status), "skip")
        detail = r.reason or (f"tolerance {r.tolerance:g}" if r.tolerance else "")
        detail += f" ({again})" if r.status is Verdict.FAIL else ""
        checks.append(Check("check", name, outcome, max(errors) if errors else None, detail or "", seconds))
    return checks


# ---------------------------------------------------------------------------------------------- compile


def _largest_check_shape(op: Op) -> tuple[int, ...]:
    return max(op.defaults.check_shapes, key=lambda s: (math.prod(s), len(s)))


def compile_modules(log: Log, device: str = "cuda") -> list[Check]:
    """Every fuselab.nn module built with its default arguments, under torch.compile(fullgraph=True), forward and
    backward, against the same module in eager mode and against its impl="torch" twin in float64."""
    checks: list[Check] = []
    for op in all_ops():
        if op.module is None:
            continue
        for dtype in (torch.float32, torch.bfloat16):
            name = f"{op.module.__name__}() {short_name(dtype_name(dtype))}"
            with attempt(checks, "compile", name, log) as result:
                module = op.module()
                reference = op.module(impl="torch")
                shape = _largest_check_shape(op)
                inputs = op.make_inputs(shape, dtype, device, 1)
                eager_xs = [x.clone().requires_grad_(True) for x in inputs]
                compiled_xs = [x.clone().requires_grad_(True) for x in inputs]
                xs64 = [x.detach().double().requires_grad_(True) for x in inputs]
                eager = module(*eager_xs)
                compiled = torch.compile(module, fullgraph=True)(*compiled_xs)
                expected = reference(*xs64)
                dy = torch.randn(expected.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
                dy = dy.to(device)
                for out in (eager, compiled):
                    out.backward(dy.to(dtype))
                expected.backward(dy)
                err = max(
                    relative_error(compiled, expected),
                    relative_error(compiled, eager),
                    gradient_error([x.grad for x in compiled_xs], [x.grad for x in xs64]),
                    gradient_error([x.grad for x in compiled_xs], [x.grad for x in eager_xs]),
                )
                what = f"{module!r} at {format_shape(shape)}: compiled against eager and float64, output and grad"
                result.update(_error_check(err, op.tolerance[dtype], what))
    return checks


def cs336_step(cls_name: str, log: Log, device: str = "cuda") -> list[Check]:
    """CS336's leaderboard step, `f = torch.compile(Cls.apply); o = f(q, k, v, causal); o.sum().backward()`, for
    the class `cls_name` (FlashAttentionTriton, or the tiled PyTorch FlashAttentionTiled), against eager and
    float64; the Triton class also at the leaderboard's own size, against eager."""
    import fuselab.ops.attention as attention
    from fuselab.ops.attention import ATTENTION
    from fuselab.ops.attention.spec import reference

    cls = getattr(attention, cls_name)
    triton = cls_name == "FlashAttentionTriton"
    cases: list[tuple[tuple[int, ...], torch.dtype, bool, bool]] = []  # shape, dtype, causal, against float64
    for dtype in (torch.float32, torch.bfloat16):
        for causal in (False, True):
            cases.append(((4, 1024, 64) if triton else (2, 130, 16), dtype, causal, True))
    if triton:
        cases.append(((16, 16384, 64), torch.bfloat16, True, False))  # the leaderboard's size
    checks: list[Check] = []
    for shape, dtype, causal, fp64 in cases:
        name = f"{cls_name} {format_shape(shape)} {short_name(dtype_name(dtype))} causal={causal}"
        with attempt(checks, "compile", name, log) as result:
            gen = torch.Generator(device=device).manual_seed(sum(shape))
            q, k, v = (torch.randn(shape, generator=gen, device=device).to(dtype) for _ in range(3))

            def step(f: Callable, q=q, k=k, v=v, causal=causal) -> tuple[torch.Tensor, list[torch.Tensor]]:
                xs = [t.clone().requires_grad_(True) for t in (q, k, v)]
                o = f(*xs, causal)
                o.sum().backward()
                return o, [x.grad for x in xs]

            o_compiled, g_compiled = step(torch.compile(cls.apply))
            o_eager, g_eager = step(cls.apply)
            tol = ATTENTION.tolerance[dtype]
            err = max(relative_error(o_compiled, o_eager), gradient_error(g_compiled, g_eager))
            what = "compiled against eager"
            if fp64:
                xs64 = [t.double().requires_grad_(True) for t in (q, k, v)]
                o64 = reference(*xs64, causal=causal)
                o64.sum().backward()
                err = max(err, relative_error(o_compiled, o64), gradient_error(g_compiled, [x.grad for x in xs64]))
                what += " and float64"
            result.update(_error_check(err, tol, f"{what}, o and o.sum()'s gradients"))
    return checks


# ---------------------------------------------------------------------------------------------- the model


def drop_in_model(dtype_short: str, log: Log, device: str = "cuda") -> list[Check]:
    """A small GPT of fuselab's drop-ins against the same model of torch.nn's, eager and compiled fullgraph, in
    `dtype_short` (fp32 or bf16)."""
    from fuselab.gate.model import compare_models

    dtype = parse_dtype(dtype_short)
    checks: list[Check] = []
    for compiled in (False, True):
        name = f"4 GPT blocks {dtype_short} {'compiled fullgraph' if compiled else 'eager'}"
        with attempt(checks, "model", name, log) as result:
            err, tol, what = compare_models(dtype, compiled, device)
            result.update(_error_check(err, tol, what))
    return checks


# ---------------------------------------------------------------------------------------------- bench


def bench_rows(op: Op, log: Log, device: str = "cuda") -> list[Check]:
    """One short `fuselab bench` of every impl of `op` (that it runs and measures, not how fast), forward and, where
    an impl has one, forward + backward."""
    shape = _largest_check_shape(op)  # small: the gate asks that every impl runs and is timed, not how fast
    passes = ("forward", "forward+backward") if any(i.backward for i in op.impls.values()) else ("forward",)
    checks: list[Check] = []
    start = time.perf_counter()
    try:
        chosen = Selection(dtypes=[torch.bfloat16], shapes=[shape], device=device)
        rows = bench_op(op, chosen, timing=BENCH_TIMING, rounds=1, show_progress=False, passes=passes, call_cost_ms=2.0)
    except Exception as exc:
        log.write(f"bench {op.name}", traceback.format_exc())
        return [Check("bench", op.name, "fail", None, f"{type(exc).__name__}: {exc}"[:400])]
    seconds = (time.perf_counter() - start) / max(len(rows), 1)
    for r in rows:
        options = " ".join(f"{k}={v}" for k, v in r.case.options)
        name = f"{op.name} {r.case.impl} bf16 {format_shape(shape)} {r.case.pass_}" + (f" {options}" if options else "")
        status = str(r.status)
        if status == "ok":
            outcome, detail = "pass", f"median {r.median_ms:.4g} ms"
        else:  # unavailable here (an impl without a backward, in the backward pass) is listed; an error fails
            outcome, detail = ("skip" if status in ("unavailable", "skipped") else "fail"), str(r.error)
        checks.append(Check("bench", name, outcome, r.median_ms, detail[:400], seconds))
    return checks
