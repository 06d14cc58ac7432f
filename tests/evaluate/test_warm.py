"""warm_up: a bench run's compiles made first in worker processes, on a toy op whose compiled impl needs no C++
compiler on the CPU (a matrix product: Inductor calls aten's), so the workers stay quick."""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import re

import pytest
import torch

from fuselab.bench import distributed
from fuselab.bench.compiled import cache_lookups
from fuselab.bench.record import PASSES, Case
from fuselab.evaluate import Selection, bench_op
from fuselab.evaluate.warm import WarmUpWarning, balanced_batches, done_keys, warm_cases, warm_up, warms
from fuselab.ops.registry import Defaults, Op

FAILING_ROWS = 13  # the compiled impl raises on inputs of this many rows, in the workers as in the timed run
CRASHING_ROWS = 9  # and kills the worker process on inputs of this many
TIMING = {"warmup_ms": 0, "min_warmup": 1, "rep_ms": 0, "min_reps": 3, "max_reps": 3}


def _gram(x: torch.Tensor) -> torch.Tensor:
    return x @ x.mT


def _gram_or_fail(x: torch.Tensor) -> torch.Tensor:
    if x.shape[0] == FAILING_ROWS:
        raise ValueError(f"no gram of {FAILING_ROWS} rows here")
    if x.shape[0] == CRASHING_ROWS and multiprocessing.parent_process() is not None:
        os._exit(3)  # a worker dies (as a segfault would); in the timed run (the test's process) the case is fine
    return x @ x.mT


def toy_op() -> Op:
    """The op, made afresh: a module-level function, so that spawned workers can import this module and call it."""

    def make_inputs(shape, dtype, device, seed):
        gen = torch.Generator().manual_seed(seed)
        return (torch.randn(shape, generator=gen).to(device, dtype),)

    op = Op(
        name="toy_gram",
        reference=_gram,
        make_inputs=make_inputs,
        bytes_moved=lambda shape, dtype: (math.prod(shape) + shape[0] ** 2) * dtype.itemsize,
        flops=lambda shape: 2 * shape[0] ** 2 * shape[1],
        tolerance={torch.float32: 1e-5},
        dtypes=(torch.float32,),
        defaults=Defaults(check_shapes=[(5, 3)], bench_shapes=[(5, 3)], baseline="torch"),
    )
    op.impl("torch", backward=True)(_gram)
    op.impl("compiled", compiled=True, backward=True)(_gram_or_fail)
    op.impl("compiled_forward_only", compiled=True)(_gram)
    op.impl("gpu_compiled", compiled=True, devices=("cuda",))(_gram)
    return op


def test_workers_warm_every_compiled_case_the_timed_run_then_reads_the_cache_and_failures_only_warn(
    tmp_path, monkeypatch, cache
):
    """Two workers warm the four compiled cases, two each by estimated cost (`balanced_batches`): worker 1 the first
    and the second, which fails, worker 2 the third and the fourth, which kills it. Each is a warning naming it; the
    others are warmed into a fresh Inductor cache folder. The timed run then compiles only the lost case itself
    (every other lookup a hit), and its rows are as ever: the failing case an error row with the same message, the
    others ok."""
    monkeypatch.setenv("FUSELAB_CACHE", str(cache))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    op = toy_op()
    shapes = [(5, 3), (FAILING_ROWS, 3), (7, 4), (CRASHING_ROWS, 2)]
    chosen = Selection(impls=["torch", "compiled"], dtypes=["fp32"], shapes=shapes, device="cpu")
    cases = warm_cases(op, chosen)
    assert [(c.impl, c.shape) for c in cases] == [("compiled", s) for s in shapes]

    lines: list[str] = []
    with pytest.warns(WarmUpWarning) as warned:
        warm = warm_up(toy_op, cases, jobs=2, device="cpu", say=lines.append)
    assert sorted(str(w.message) for w in warned) == [
        "warm-up: compiled fp32 13x3 forward failed: ValueError: no gram of 13 rows here (the timed run meets it "
        "again and records it)",
        "warm-up: worker 2 exited (code 3) with 1 of its cases not warmed; the timed run compiles them itself",
    ]
    assert (warm.jobs, warm.workers, warm.cases, warm.warmed, warm.skipped, warm.lost) == (2, 2, 4, 2, 0, 1)
    assert warm.failed == (("compiled fp32 13x3 forward", "ValueError: no gram of 13 rows here"),)
    assert warm.cache_dir == str(tmp_path / "inductor") and (tmp_path / "inductor" / "fxgraph").is_dir()
    assert lines[0] == "warm-up: 4 cases over 2 worker processes"
    finished = sorted(re.sub(r"done in [\d.]+ s", "done in T s", line) for line in lines[1:])
    assert finished == [
        "warm-up: worker 1/2 done in T s: 1 of 2 cases warmed, 1 failed",
        "warm-up: worker 2/2 done in T s: 1 of 2 cases warmed, 1 lost",
    ]
    assert warm.meta()["failed"] == 1 and warm.meta()["lost"] == 1 and warm.meta()["seconds"] > 0
    assert "2 of 4 cases warmed (1 failed, 1 lost) by 2 workers" in warm.summary()

    with cache_lookups() as lookups:
        rows = bench_op(op, chosen, timing=TIMING, rounds=1, show_progress=False, call_cost_ms=0)
    outcome = {(r.case.impl, r.case.shape): (str(r.status), r.error) for r in rows}
    assert outcome.pop(("compiled", (FAILING_ROWS, 3))) == ("error", "ValueError: no gram of 13 rows here")
    assert set(outcome.values()) == {("ok", None)} and len(outcome) == 7
    assert lookups["miss"] == 1 and lookups["hit"] >= 2  # the lost case compiled here; the workers' graphs read back


def test_warm_cases_are_the_compiled_cases_the_run_would_call_and_not_those_done_in_its_log(tmp_path):
    """Only compiled impls, only where they run (not a GPU-only impl on the CPU), forward + backward only for an impl
    with a backward; a resumed run's log keeps its finished cases out (its failed ones stay in)."""
    op = toy_op()
    chosen = Selection(dtypes=["fp32"], shapes=[(5, 3), (7, 4)], device="cpu")
    cases = warm_cases(op, chosen, passes=("forward", "forward+backward"))
    got = [(c.impl, c.shape, c.pass_) for c in cases]
    assert got == [
        (impl, shape, pass_)
        for shape in ((5, 3), (7, 4))
        for pass_ in ("forward", "forward+backward")
        for impl in ("compiled", "compiled_forward_only")
        if not (impl == "compiled_forward_only" and pass_ == "forward+backward")
    ]
    log = tmp_path / "r.jsonl"
    rows = [{**cases[0].to_json(), "key": cases[0].key, "error": None}]
    rows.append({**cases[1].to_json(), "key": cases[1].key, "error": "ValueError: failed"})
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert done_keys(log) == {cases[0].key} and done_keys(None) == set()
    assert warm_cases(op, chosen, passes=("forward", "forward+backward"), done=done_keys(log)) == cases[1:]
    with pytest.raises(ValueError, match="unknown pass"):
        warm_cases(op, chosen, passes=("backward",))


def test_on_a_gpu_every_impl_is_warmed_on_the_cpu_only_compiled_ones():
    """Triton's JIT compiles a kernel per case of a Triton impl, and which impls launch Triton kernels is not known
    before their call: on a GPU every impl's cases are warmed; on the CPU only compiled impls compile anything."""
    op = toy_op()
    assert [warms(op.get_impl(n), "cpu") for n in ("torch", "compiled")] == [False, True]
    assert [warms(op.get_impl(n), "cuda") for n in ("torch", "compiled")] == [True, True]
    assert warms(op.get_impl("torch"), "cuda:1")


@pytest.mark.gpu
def test_a_gpu_draw_warms_every_impl_and_the_timed_run_gives_the_same_rows(tmp_path, monkeypatch, cache):
    """On a GPU a worker calls each case of every impl once (softmax's Triton impl among them, whose JIT compiles a
    kernel per case); the timed run then times every case, all ok."""
    from functools import partial

    from fuselab.ops import get_op

    monkeypatch.setenv("FUSELAB_CACHE", str(cache))
    op = get_op("softmax")
    chosen = Selection(impls=["torch", "triton"], dtypes=["fp32"], shapes=[(37, 1234), (5, 70001)], device="cuda")
    cases = warm_cases(op, chosen, passes=("forward", "forward+backward"))
    assert sorted({c.impl for c in cases}) == ["torch", "triton"] and len(cases) == 8
    warm = warm_up(partial(get_op, "softmax"), cases, jobs=2, device="cuda", say=lambda _: None)
    assert (warm.cases, warm.warmed, warm.failed, warm.lost) == (8, 8, (), 0)
    rows = bench_op(op, chosen, timing=TIMING, rounds=1, show_progress=False, call_cost_ms=0,
                    passes=("forward", "forward+backward"))  # fmt: skip
    assert len(rows) == 8 and {str(r.status) for r in rows} == {"ok"}
    assert all(r.rel_err is not None and r.rel_err < 1e-5 for r in rows)


@pytest.mark.parametrize("jobs", [2, 3, 4, 8, 15, 16])
def test_every_worker_gets_an_equal_share_of_the_compiles_whatever_the_order_of_impls_and_passes(jobs):
    """A run's cases come shape by shape, pass by pass, impl by impl (`bench_grid`): dealt out in turn (k, k + jobs,
    ...) they line up with that period, and a few workers get every compile (15 workers over a draw of 5 impls gave
    all 1200 compiled cases to 3 of them on the H200). Split by estimated cost, each worker's compiles (a forward +
    backward counting two) are within one such case of every other's; every case is given once, in its order."""
    op = toy_op()
    impls = ("torch", "compiled", "compiled_forward_only", "gpu_compiled")
    cases = [
        Case.of(op.name, impl, torch.float32, (rows, 3 + rows % 5), pass_=pass_)
        for rows in range(5, 65)
        for pass_ in PASSES
        for impl in impls
    ]
    batches = balanced_batches(op, cases, jobs)
    assert len(batches) == jobs
    assert sorted((c for b in batches for c in b), key=cases.index) == cases
    assert all(b == sorted(b, key=cases.index) for b in batches)
    compiles = [sum((2 if c.backward else 1) for c in b if op.get_impl(c.impl).compiled) for b in batches]
    assert max(compiles) - min(compiles) <= 2, compiles
    few = balanced_batches(op, cases[:3], jobs)
    assert len(few) == min(jobs, 3) and sorted((c for b in few for c in b), key=cases.index) == cases[:3]


def test_warm_up_is_refused_under_torchrun_and_asks_for_a_loader_a_worker_can_import(monkeypatch):
    """Under torchrun the ranks compile their own shares already: a clear refusal, before any worker starts. A loader
    that cannot be pickled to a spawned worker (a lambda) is a TypeError saying what to give instead."""
    op = toy_op()
    cases = warm_cases(op, Selection(impls=["compiled"], dtypes=["fp32"], shapes=[(5, 3)], device="cpu"))
    with pytest.raises(TypeError, match=r"give a module-level function or a functools\.partial of one"):
        warm_up(lambda: toy_op(), cases, jobs=1, device="cpu", say=lambda _: None)
    monkeypatch.setattr(distributed, "active", lambda: True)
    for some in (cases, []):
        with pytest.raises(ValueError, match=r"not under torchrun \(--gpus N\)"):
            warm_up(toy_op, some, jobs=2, device="cpu")


def test_no_compiled_case_starts_no_worker():
    warm = warm_up(toy_op, [], jobs=4, device="cpu", say=lambda line: pytest.fail(line))
    assert (warm.workers, warm.cases, warm.warmed) == (0, 0, 0)
    assert warm.summary().startswith("warm-up: no case to warm")
