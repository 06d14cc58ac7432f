"""check_op and bench_op on a toy op, so the machinery is tested apart from any real kernel."""

import json
import math
import re
from dataclasses import replace

import pytest
import torch

from fuselab.bench.accuracy import gradient_error, relative_error
from fuselab.bench.dtypes import parse_dtype
from fuselab.bench.record import Case, CheckRow, Row
from fuselab.bench.sweep import Unavailable
from fuselab.evaluate import Selection, add_derived, bench_op, check_op
from fuselab.ops.registry import Defaults, Op, UnknownName, get_op, parse_shape


def make_toy() -> Op:
    def make_inputs(shape, dtype, device, seed):
        gen = torch.Generator().manual_seed(seed)
        return (torch.randn(shape, generator=gen).to(device, dtype),)

    op = Op(
        name="toy_square",
        reference=lambda x: x * x,
        make_inputs=make_inputs,
        bytes_moved=lambda shape, dtype: 2 * math.prod(shape) * torch.empty((), dtype=dtype).element_size(),
        flops=lambda shape: math.prod(shape),
        tolerance={torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 1e-2},
        defaults=Defaults(check_shapes=[(1,), (1023,), (3, 17)], bench_shapes=[(4096,)], baseline="torch"),
    )
    op.impl("torch")(lambda x: x * x)
    op.impl("wrong")(lambda x: x * x + 1e-3 * x.abs().max())
    op.impl("lazy")(lambda x: torch.empty_like(x))  # never writes its output
    op.impl("gpu_only", devices=("cuda",))(lambda x: x * x)
    op.impl("missing_lib", requires=lambda device: "libfoo is not installed")(lambda x: x * x)
    op.impl("compiled", compiled=True)(lambda x: x * x)
    op.impl("half_only", dtypes=(torch.float16, torch.bfloat16))(lambda x: (x * x).to(torch.float16))
    op.impl("no_kernel_past_1000")(_no_kernel_past_1000)
    return op


def _no_kernel_past_1000(x: torch.Tensor) -> torch.Tensor:
    """As a forced SDPA backend: some cases have no kernel, and the impl says so instead of failing."""
    if x.numel() > 1000:
        raise Unavailable(f"no kernel for {x.numel()} elements")
    return x * x


def test_relative_error_matches_hand_computation_and_nonfinite_rules():
    ref = torch.tensor([3.0, 4.0], dtype=torch.float64)
    assert relative_error(torch.tensor([3.0, 4.5]), ref) == pytest.approx(0.5 / 5)
    assert relative_error(torch.tensor([3.0]), ref) == math.inf  # shape mismatch
    with_nan = torch.tensor([1.0, float("nan"), float("-inf")], dtype=torch.float64)
    assert relative_error(with_nan.float(), with_nan) == 0.0
    assert relative_error(torch.tensor([1.0, float("nan"), float("inf")]), with_nan) == math.inf
    assert relative_error(torch.tensor([1.0, 2.0, float("-inf")]), with_nan) == math.inf
    assert relative_error(torch.tensor([float("nan"), 4.0]), ref) == math.inf


def test_gradient_error_measures_a_zero_gradient_against_its_share_of_the_whole():
    big = torch.randn(64, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    zero = torch.zeros(64, dtype=torch.float64)
    noise = torch.full((64,), 1e-7, dtype=torch.float64)
    share = (big.norm() ** 2 / 2) ** 0.5  # both inputs hold half the elements
    assert gradient_error([noise, big], [zero, big]) == pytest.approx((noise.norm() / share).item())
    assert gradient_error([noise, big], [zero + 1e-17, big]) < 1e-6  # relative_error would read ~1e10
    assert gradient_error([big, big * 1.1], [big, big]) == pytest.approx(0.1)  # a wrong gradient stays wrong
    assert gradient_error([big * 0, big], [big, big]) == pytest.approx(1.0)  # and so does a missing one
    assert gradient_error([torch.full((64,), math.nan), big], [zero, big]) == math.inf


def test_gradient_error_measures_against_the_op_scale_where_the_gradient_cancels_bigger_terms():
    ref = torch.randn(64, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    off = ref * 1.01
    assert gradient_error([off], [ref]) == pytest.approx(0.01)
    assert gradient_error([off], [ref], [10 * ref.norm().item()]) == pytest.approx(0.001)
    assert gradient_error([off], [ref], [0.1 * ref.norm().item()]) == pytest.approx(0.01)  # a scale never tightens


def test_an_impl_is_held_to_its_tolerance_scale():
    op = get_op("gelu")
    chosen = Selection(impls=["naive", "torch"], dtypes=[torch.float32], shapes=[(17,)])
    rows = check_op(op, chosen, show_progress=False)
    tolerance = {r.case.impl: r.tolerance for r in rows}
    scale = op.get_impl("naive").tolerance_scale
    fp32 = op.tolerance[torch.float32]
    assert scale > 1 and tolerance == {"naive": scale * fp32, "torch": fp32}


def test_a_check_over_its_tolerance_says_by_how_much():
    rows = check_op(make_toy(), Selection(impls=["wrong"], dtypes=[torch.float32], device="cpu"), show_progress=False)
    assert rows and all(r.status == "FAIL" for r in rows)
    assert all(re.search(r"output relative error \S+ over the float32 tolerance 1e-06", r.reason) for r in rows)


def test_check_passes_right_impls_fails_wrong_and_unwritten_ones_and_explains_unavailable():
    rows = check_op(make_toy(), Selection(dtypes=[torch.float32], device="cpu"), show_progress=False)
    status = {}
    for row in rows:
        status.setdefault(row.case.impl, set()).add(str(row.status))
    assert status["torch"] == {"pass"} and status["compiled"] == {"pass"}
    assert status["wrong"] == {"FAIL"}
    assert status["lazy"] == {"FAIL"}  # the poisoned allocator shows the unwritten output
    assert status["gpu_only"] == {"unavailable"} and status["missing_lib"] == {"unavailable"}
    reasons = {r.case.impl: r.reason for r in rows}
    assert "cuda only" in reasons["gpu_only"] and "libfoo" in reasons["missing_lib"]
    assert all(r.rel_err < 1e-6 for r in rows if r.case.impl == "torch")


def test_an_impl_is_unavailable_in_the_dtypes_it_does_not_compute_in(tmp_path):
    op = make_toy()
    half_only = Selection(impls=["half_only"], dtypes=[torch.float32, torch.float16], device="cpu")
    rows = check_op(op, half_only, show_progress=False)
    by_dtype = {r.case.dtype: r for r in rows}
    assert by_dtype["float32"].status == "unavailable"
    assert "float16, bfloat16 only, not float32" in by_dtype["float32"].reason
    assert by_dtype["float16"].status == "pass"  # not refused: the impl is run, and right, in what it declares
    timing = {"warmup_ms": 1, "rep_ms": 2, "min_reps": 3}
    fp32 = Selection(impls=["torch", "half_only"], dtypes=[torch.float32], device="cpu")
    rows = bench_op(op, fp32, timing=timing, out=tmp_path / "r.jsonl", show_progress=False)
    by_impl = {r.case.impl: r for r in rows}
    assert by_impl["torch"].median_ms > 0 and "not float32" in by_impl["half_only"].error


def test_a_case_the_impl_has_no_kernel_for_is_unavailable_not_failed():
    chosen = Selection(impls=["no_kernel_past_1000"], dtypes=[torch.float32], device="cpu")
    rows = check_op(make_toy(), chosen, show_progress=False)
    by_shape = {r.case.shape: r for r in rows}
    assert by_shape[(1,)].status == "pass" and by_shape[(3, 17)].status == "pass"
    assert by_shape[(1023,)].status == "unavailable" and "no kernel for 1023" in by_shape[(1023,)].reason


def test_check_uses_fresh_inputs_unless_seeded():
    op = make_toy()
    chosen = Selection(impls=["torch"], dtypes=[torch.float32], device="cpu")
    a = check_op(op, chosen, show_progress=False)
    b = check_op(op, chosen, show_progress=False)
    assert [r.seed for r in a] != [r.seed for r in b]
    c = check_op(op, chosen, seed=5, show_progress=False)
    d = check_op(op, chosen, seed=5, show_progress=False)
    assert [r.seed for r in c] == [r.seed for r in d]


def test_bench_rows_carry_speed_errors_and_environment(tmp_path):
    op = make_toy()
    timing = {"warmup_ms": 1, "rep_ms": 5, "min_reps": 3}
    rows = bench_op(
        op,
        Selection(impls=["torch", "compiled", "gpu_only"], dtypes=[torch.float32], device="cpu"),
        out=tmp_path / "r.jsonl",
        timing=timing,
        show_progress=False,
    )
    by_impl = {r.case.impl: r for r in rows}
    assert by_impl["torch"].median_ms > 0 and by_impl["torch"].gbps > 0
    assert by_impl["torch"].speedup == pytest.approx(1.0) and by_impl["torch"].baseline == "torch"
    assert by_impl["torch"].torch == torch.__version__ and "triton" in by_impl["torch"].to_json()
    assert by_impl["compiled"].compile_s > 0 and by_impl["compiled"].compile_graphs == 1
    same = by_impl["torch"].copy_same_gbps  # a copy of the same bytes, timed after the sweep
    assert same > 0 and by_impl["compiled"].copy_same_gbps == same
    assert by_impl["torch"].pct_copy_same == pytest.approx(100 * by_impl["torch"].gbps / same)
    assert "cuda only" in by_impl["gpu_only"].error


def test_bench_times_the_impls_of_one_case_back_to_back(tmp_path):
    """The sweep runs case by case with the impl varying fastest (the log is written in run order), so impls that are
    compared were timed next to each other, not a whole sweep apart."""
    timing = {"warmup_ms": 1, "rep_ms": 2, "min_reps": 3}
    log = tmp_path / "r.jsonl"
    impls, shapes = ["torch", "wrong"], [(64,), (128,)]
    dtypes = [torch.float32, torch.bfloat16]
    chosen = Selection(impls=impls, dtypes=dtypes, shapes=shapes, device="cpu")
    rows = bench_op(make_toy(), chosen, out=log, timing=timing, show_progress=False)
    expected = [(d, list(s), i) for d in ("float32", "bfloat16") for s in shapes for i in impls]
    logged = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(r["dtype"], r["shape"], r["impl"]) for r in logged] == expected
    assert [(r.case.dtype, list(r.case.shape), r.case.impl) for r in rows] == expected


def test_bench_impls_of_a_case_take_turns_on_one_input(tmp_path):
    """With rounds=3 the impls' timed calls alternate three times, all on the same input tensor; an impl that fails
    is reported alone and the others are still timed."""
    op = make_toy()
    seen: list[tuple[str, int]] = []

    def recording(name):
        def fn(x):
            seen.append((name, x.data_ptr()))
            return x * x

        return fn

    op.impl("first")(recording("first"))
    op.impl("second")(recording("second"))
    op.impl("broken")(lambda x: x.reshape(3, -1))  # 4096 elements: raises
    timing = {"warmup_ms": 0, "min_warmup": 1, "rep_ms": 0, "min_reps": 6, "max_reps": 6}
    # call_cost_ms=0: the call-cost measurement would call the impls again after the timed rounds
    chosen = Selection(impls=["first", "broken", "second"], dtypes=[torch.float32], device="cpu")
    rows = bench_op(op, chosen, timing=timing, rounds=3, show_progress=False, call_cost_ms=0)
    by_impl = {r.case.impl: r for r in rows}
    assert by_impl["first"].rounds == 3 and by_impl["first"].n == 6 and by_impl["second"].n == 6
    assert "RuntimeError" in by_impl["broken"].error and by_impl["second"].error is None
    assert len({ptr for _, ptr in seen}) == 1
    timed = [name for name, _ in seen[-12:]]
    assert timed == ["first"] * 2 + ["second"] * 2 + ["first"] * 2 + ["second"] * 2 + ["first"] * 2 + ["second"] * 2
    with pytest.raises(ValueError, match="rounds"):
        bench_op(op, Selection(impls=["first"], device="cpu"), rounds=0, show_progress=False)


def test_bench_call_cap_leaves_a_slow_impl_out_of_costlier_cases_and_keeps_it_out_on_resume(tmp_path):
    """max_call_ms: an impl whose call took longer at one case is skipped, with the reason, at the sweep's cases that
    cost more (same dtype and pass); the fast impl is still timed everywhere, and without the cap so is the slow; a
    resumed sweep reads the slow call from its log and does not time it there either."""
    import time

    op = make_toy()

    def slow_past_100(x):  # 5 ms a call from 100 elements on
        if x.numel() >= 100:
            time.sleep(0.005)
        return x * x

    op.impl("slow")(slow_past_100)
    timing = {"warmup_ms": 0, "min_warmup": 1, "rep_ms": 0, "min_reps": 3, "max_reps": 3}
    log = tmp_path / "capped.jsonl"
    shapes = [(64,), (101,), (11, 10), (300,), (30, 30)]
    chosen = Selection(impls=["torch", "slow"], dtypes=[torch.float32], shapes=shapes, device="cpu")
    kwargs = dict(out=log, timing=timing, rounds=1, show_progress=False, call_cost_ms=0, max_call_ms=2.0)
    rows = bench_op(op, chosen, **kwargs)
    slow = {r.case.shape: r for r in rows if r.case.impl == "slow"}
    assert slow[(64,)].status == "ok" and slow[(101,)].status == "ok" and slow[(101,)].median_ms > 2.0
    assert slow[(11, 10)].status == "skipped" and slow[(300,)].status == "skipped"
    assert "ms a call already at 101" in slow[(300,)].error and "2 ms a call this sweep allows" in slow[(300,)].error
    assert all(r.status == "ok" for r in rows if r.case.impl == "torch")
    start = time.perf_counter()
    again = bench_op(op, chosen, **kwargs)  # resumed: the skipped rows are run again, and skipped again
    assert [r.status for r in again] == [r.status for r in rows]
    assert time.perf_counter() - start < 1.0
    uncapped = bench_op(op, replace(chosen, shapes=[(300,)]), **{**kwargs, "out": None, "max_call_ms": None})
    assert all(r.status == "ok" for r in uncapped)
    backwards = bench_op(op, replace(chosen, shapes=shapes[::-1]), **{**kwargs, "out": None})  # cheapest first too
    assert {r.case: r.status for r in backwards} == {r.case: r.status for r in rows}
    assert [r.case.shape for r in backwards][::2] == shapes
    second, unlogged = replace(chosen, shapes=[(17, 19)]), {**kwargs, "out": None}  # a sweep as the report's second
    alone = {r.case.impl: r.status for r in bench_op(op, second, **unlogged)}
    assert alone == {"torch": "ok", "slow": "ok"}  # its own cap has seen no slow call yet
    after = {r.case.impl: r for r in bench_op(op, second, **unlogged, slow_before=rows)}
    assert after["slow"].status == "skipped" and "already at 101" in after["slow"].error
    assert after["torch"].status == "ok"


def test_a_resumed_bench_times_only_the_impls_its_log_lacks(tmp_path):
    op = make_toy()
    calls = {"first": 0, "second": 0}

    def counted(name):
        def fn(x):
            calls[name] += 1
            return x * x

        return fn

    op.impl("first")(counted("first"))
    op.impl("second")(counted("second"))
    timing = {"warmup_ms": 0, "min_warmup": 1, "rep_ms": 0, "min_reps": 3, "max_reps": 3}
    chosen = Selection(dtypes=[torch.float32], shapes=[(64,), (101,)], device="cpu")
    kwargs = dict(out=tmp_path / "log.jsonl", timing=timing, rounds=1, show_progress=False, call_cost_ms=0)
    bench_op(op, replace(chosen, impls=["first"]), **kwargs)
    assert calls["first"] > 0 and calls["second"] == 0
    calls["first"] = 0
    rows = bench_op(op, replace(chosen, impls=["first", "second"]), **kwargs)
    assert calls["first"] == 0 and calls["second"] > 0  # the logged impl is not timed again beside the new one
    assert [(r.case.impl, r.status) for r in rows] == [("first", "ok"), ("second", "ok")] * 2


def _row(impl, dtype, shape, median_ms, gbps, nbytes):
    return Row(Case.of("toy", impl, dtype, shape), median_ms=median_ms, gbps=gbps, bytes=nbytes)


def test_add_derived_compares_only_the_same_case():
    rows = [
        _row("torch", "float32", (8,), 2.0, 50.0, 64),
        _row("fast", "float32", (8,), 1.0, 100.0, 64),
        _row("fast", "bfloat16", (8,), 1.0, 100.0, 32),
        _row("fast", "float32", (9,), 1.0, 100.0, 72),
    ]
    rows = add_derived(rows, "torch", 200.0, same_size_copy={64: 125.0})
    assert rows[1].speedup == 2.0 and rows[1].pct_copy == 50.0 and rows[1].field("speedup_vs_torch") == 2.0
    assert rows[1].copy_same_gbps == 125.0 and rows[1].pct_copy_same == 80.0
    assert rows[2].speedup is None and rows[3].speedup is None  # another dtype, another shape
    assert rows[2].pct_copy_same is None  # no copy timed at its size
    assert not any(r.warnings for r in rows)


def test_the_reference_in_pieces_equals_the_whole_and_the_error_sums_over_pieces(monkeypatch):
    from fuselab.evaluate import cases as evaluate

    gelu, softmax = get_op("gelu"), get_op("softmax")
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(37, 129, generator=gen)
    out = torch.nn.functional.gelu(x) * (1 + 1e-4 * torch.randn(37, 129, generator=gen))
    monkeypatch.setattr(evaluate, "REFERENCE_PIECE_BYTES", 5 * 129 * 8)  # 5 rows a piece
    rows = evaluate.reference_rows(gelu, (x,))
    assert rows == 5
    whole = gelu.reference(x.double(), approximate="none")
    pieces = evaluate.reference_of(gelu, (x,), {"approximate": "none"}, rows)
    assert pieces.dtype == torch.float32 and relative_error(pieces, whole) < 1e-7
    assert relative_error(out, whole, rows) == pytest.approx(relative_error(out, whole), rel=1e-9)
    bad = out.clone()
    bad[31, 7] = float("nan")  # in the seventh piece
    assert relative_error(bad, whole, rows) == math.inf
    assert evaluate.reference_rows(softmax, (torch.randn(1000),)) is None  # a 1-D softmax is one row: whole
    assert evaluate.reference_rows(softmax, (x,)) == 5
    assert evaluate.reference_rows(get_op("attention"), (torch.randn(2, 9, 16),) * 3) is None  # not declared


def test_a_rate_past_the_copy_ceiling_is_flagged_on_the_row_and_in_the_table():
    from fuselab.cli.bench import above_ceiling_lines
    from fuselab.evaluate import ABOVE_CEILING_NOTE

    rows = [_row("torch", "float32", (8, 128), 1.0, 615.0, 64), _row("torch", "float32", (9, 128), 1.0, 105.0, 72)]
    rows = add_derived(rows, "torch", 1000.0, same_size_copy={64: 100.0, 72: 100.0})
    assert rows[0].warnings == (f"615% of {ABOVE_CEILING_NOTE}",)
    assert not rows[1].warnings  # 105%: within the timing's own spread
    (line,) = above_ceiling_lines(rows)
    assert "torch" in line and "fp32 8x128 615%" in line and "stayed in a cache" in line


def test_names_shapes_dtypes_options_are_validated():
    op = make_toy()
    with pytest.raises(UnknownName, match="known: torch, wrong"):
        check_op(op, Selection(impls=["nope"], device="cpu"))
    assert parse_shape("2^10x3") == (1024, 3) and parse_shape("scalar") == ()
    with pytest.raises(ValueError, match="bad shape"):
        parse_shape("3x-")
    assert parse_dtype("bf16") is torch.bfloat16
    with pytest.raises(ValueError, match="accepted"):
        parse_dtype("int8")
    with pytest.raises(ValueError, match="no option"):
        op.resolve_options({"approximate": "tanh"})


def test_summary_of_cases_some_passed_some_not_run():
    """The H200 report showed sdpa-cudnn bf16 as 'unavailable' beside its errors: cuDNN refused the first check shape
    and passed the others. A group with a pass and no failure is a pass that counts the cases not run; a failure
    wins over both; a group with no case run keeps its status."""
    from fuselab.evaluate import summarize_checks

    def case(status, shape, err=None, reason=None):
        return CheckRow(Case.of("toy", "i", "bf16", shape, pass_=None), status, rel_err=err, reason=reason)

    refused = case("unavailable", (2, 1, 16), reason="no kernel for d=16")
    (mixed,) = summarize_checks([refused, case("pass", (3, 65), 1e-3), case("pass", (5, 7), 2e-3)])
    assert mixed.status == "pass" and mixed.rel_err == 2e-3 and mixed.cases == 3
    assert mixed.reason == "1 of 3 cases unavailable: no kernel for d=16"
    (failed,) = summarize_checks([refused, case("pass", (3, 65), 1e-3), case("FAIL", (5, 7), 9.0, "over")])
    assert failed.status == "FAIL" and failed.reason == "over"
    (none_run,) = summarize_checks([refused, case("unavailable", (3, 3), reason="no kernel for d=16")])
    assert none_run.status == "unavailable" and none_run.reason == "no kernel for d=16"
    (passed,) = summarize_checks([case("pass", (3, 65), 1e-3), case("pass", (3, 65), 1e-3)])
    assert passed.status == "pass" and passed.reason is None and passed.cases == 2
    other_dtype = CheckRow(Case.of("toy", "i", "fp32", (3,), pass_=None), "pass", rel_err=1e-7)
    assert len(summarize_checks([refused, other_dtype])) == 2  # one summary per impl and dtype
