"""One contract over every registered op × impl: what any implementation must do, whatever the op.

Each impl is checked against the op's float64 reference on fresh random inputs at the op's small odd shapes, in
every dtype it declares (the Triton interpreter: fp32 only), on non-contiguous inputs, with NaN and ±inf among the
inputs, with gradients where it has a backward, and it answers bad input (an integer tensor, a tensor on a device it
does not run on, an unknown impl name) with a clear error. Per-op test files keep only what is particular to an op.
"""

from __future__ import annotations

import pytest
import torch

from fuselab.ops.evaluate import check_case, fresh_seed, relative_error
from fuselab.ops.registry import Impl, Op, UnknownName, all_ops

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _cases() -> list:
    cases = []
    for op in all_ops():
        for name, impl in op.impls.items():
            cases.append(pytest.param(op, impl, id=f"{op.name}-{name}"))
    return cases


CASES = _cases()


def _usable(impl: Impl) -> None:
    reason = impl.unavailable(DEVICE)
    if reason:
        pytest.skip(reason)


def _dtypes(op: Op, impl: Impl) -> list[torch.dtype]:
    if impl.compiled:
        return [torch.float32]  # one compile per case: the other dtypes are the naive impl's
    if DEVICE == "cpu" and impl.triton_kernels is not None:
        return [torch.float32]  # the Triton interpreter is exact in fp32 only
    return list(op.dtypes)


def _shapes(op: Op, impl: Impl) -> list[tuple[int, ...]]:
    shapes = [tuple(s) for s in op.report_plan("quick")["check_shapes"]]
    return shapes[:1] if impl.compiled else shapes


def _options(op: Op) -> dict:
    """The op's defaults with every option that has choices at its last choice (the non-default path too)."""
    return {k: (o.choices[-1] if o.choices else o.default) for k, o in op.options.items()}


@pytest.mark.parametrize(("op", "impl"), CASES)
def test_matches_float64_reference_with_gradients(op: Op, impl: Impl) -> None:
    _usable(impl)
    for dtype in _dtypes(op, impl):
        for shape in _shapes(op, impl):
            for options in (op.default_options(), _options(op)):
                row = check_case(op, impl, shape, dtype, DEVICE, options, fresh_seed())
                tol = op.tolerance[dtype]
                assert row["rel_err"] <= tol, f"{dtype} {shape} {options}: rel err {row['rel_err']:.3g} > {tol}"
                if row["grad_rel_err"] is not None:
                    assert row["grad_rel_err"] <= tol, f"{dtype} {shape}: grad rel err {row['grad_rel_err']:.3g}"
                if impl.backward and all(shape) and shape:
                    assert row["grad_rel_err"] is not None


def _strided(x: torch.Tensor) -> torch.Tensor:
    """The same values, every other element of a twice-as-wide last dimension: not contiguous."""
    if x.dim() == 0:
        return x
    wide = torch.full((*x.shape[:-1], 2 * x.shape[-1]), float("nan"), dtype=x.dtype, device=x.device)
    wide[..., ::2] = x
    return wide[..., ::2]


@pytest.mark.parametrize(("op", "impl"), [c for c in CASES if not c.values[1].compiled])
def test_non_contiguous_inputs_give_the_contiguous_result(op: Op, impl: Impl) -> None:
    _usable(impl)
    shape = max(_shapes(op, impl), key=lambda s: len(s))
    options = op.default_options()
    inputs = op.make_inputs(shape, torch.float32, DEVICE, fresh_seed(), **options)
    strided = [_strided(x) for x in inputs]
    if all(s.is_contiguous() for s in strided):
        pytest.skip(f"{op.name} shape {shape} has no dimension to stride")
    ref = op.reference(*(x.double() for x in inputs), **options)
    out = impl.fn(*strided, **options)
    assert relative_error(out, ref) <= op.tolerance[torch.float32]


@pytest.mark.parametrize(("op", "impl"), [c for c in CASES if not c.values[1].compiled])
def test_nan_and_inf_inputs_follow_the_reference(op: Op, impl: Impl) -> None:
    _usable(impl)
    shape = max(_shapes(op, impl), key=lambda s: torch.Size(s).numel())
    options = op.default_options()
    inputs = list(op.make_inputs(shape, torch.float32, DEVICE, fresh_seed(), **options))
    first = inputs[0].clone()
    if first.numel() < 3:
        pytest.skip("too few elements to place NaN and infinities")
    flat = first.view(-1)
    flat[0], flat[flat.numel() // 2], flat[-1] = float("nan"), float("inf"), float("-inf")
    inputs[0] = first
    ref = op.reference(*(x.double() for x in inputs), **options)
    out = impl.fn(*inputs, **options)
    # relative_error is inf unless every non-finite reference entry is matched exactly (same NaN, same signed inf)
    assert relative_error(out, ref) <= op.tolerance[torch.float32]


@pytest.mark.parametrize(("op", "impl"), [c for c in CASES if not c.values[1].compiled])
def test_integer_input_is_refused_with_a_clear_error(op: Op, impl: Impl) -> None:
    _usable(impl)
    shape = _shapes(op, impl)[-1]
    inputs = op.make_inputs(shape, torch.float32, DEVICE, fresh_seed(), **op.default_options())
    ints = [(x * 10).to(torch.int32) for x in inputs]
    with pytest.raises((TypeError, ValueError, RuntimeError)) as info:
        impl.fn(*ints, **op.default_options())
    assert "int" in str(info.value).lower() or "dtype" in str(info.value).lower()


@pytest.mark.parametrize(("op", "impl"), [c for c in CASES if DEVICE not in c.values[1].devices])
def test_input_on_a_device_the_impl_does_not_run_on_is_refused(op: Op, impl: Impl) -> None:
    shape = _shapes(op, impl)[-1]
    inputs = op.make_inputs(shape, torch.float32, DEVICE, fresh_seed(), **op.default_options())
    with pytest.raises((ValueError, RuntimeError)) as info:
        impl.fn(*inputs, **op.default_options())
    assert DEVICE in str(info.value)


@pytest.mark.parametrize("op", all_ops(), ids=lambda op: op.name)
def test_unknown_impl_and_option_are_named_with_what_is_accepted(op: Op) -> None:
    with pytest.raises(UnknownName) as info:
        op.get_impl("no-such-impl")
    assert all(name in str(info.value) for name in op.impls)
    with pytest.raises(ValueError, match="no option"):
        op.resolve_options({"no_such_option": 1})
    for key, option in op.options.items():
        if option.choices and option.kind is str:
            with pytest.raises(ValueError, match="accepted"):
                op.resolve_options({key: "no-such-value"})


@pytest.mark.parametrize("op", all_ops(), ids=lambda op: op.name)
def test_spec_is_complete(op: Op) -> None:
    """Inputs named, cost model positive, tolerances for every dtype, defaults for every tool."""
    shape = op.default_profile_shape()
    options = op.default_options()
    inputs = op.make_inputs(_shapes(op, next(iter(op.impls.values())))[-1], torch.float32, "cpu", 1, **options)
    assert len(inputs) == len(op.inputs) and all(not bool((x == 0).all()) for x in inputs if x.numel())
    assert op.bytes_moved(shape, torch.float32, **options) > 0 and op.flops(shape, **options) > 0
    assert set(op.dtypes) <= set(op.tolerance)
    assert op.baseline in op.impls
    for mode in ("quick", "cpu", "gpu"):
        plan = op.report_plan(mode)
        assert plan["check_shapes"] and plan["bench_sweeps"] and plan["x"] in ("numel", "width", "axis")
