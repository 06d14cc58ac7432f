"""One contract over every registered op × impl: what any implementation must do, whatever the op.

Each impl is checked against the op's float64 reference on fresh random inputs at the op's small odd shapes, in
every dtype it declares (the Triton interpreter: fp32 only), on non-contiguous inputs, with NaN and ±inf among the
inputs, with gradients where it has a backward, and it answers bad input (an integer tensor, a tensor on a device it
does not run on, an unknown impl name) with a clear error. The fuselab custom ops an impl calls pass
torch.library.opcheck and compile with torch.compile(fullgraph=True) to eager's values, gradients included; they trace
with fake tensors on every device the impl lists; the op's nn module is a drop-in for its PyTorch counterpart.
Per-op test files keep only what is particular to an op.
"""

from __future__ import annotations

import importlib.util
import os
import re

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import fuselab  # noqa: F401  (TRITON_INTERPRET=1 without a GPU, before any kernel is defined)
from fuselab.bench.accuracy import relative_error
from fuselab.bench.dtypes import dtype_name
from fuselab.bench.sweep import NotRun
from fuselab.evaluate import check_case, fresh_seed
from fuselab.ops.registry import Impl, Op, UnknownName, all_ops, randn

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# The Triton interpreter computes in numpy, which warns where a kernel wants inf or NaN (exp2 overflow, -inf - -inf).
interpreter_quiet = pytest.mark.filterwarnings("ignore::RuntimeWarning")


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


def _dtype(impl: Impl) -> torch.dtype:
    """float32, or the first dtype of an impl that does not compute in it (FlashAttention: fp16/bf16 only)."""
    return torch.float32 if impl.dtypes is None or torch.float32 in impl.dtypes else impl.dtypes[0]


def _run(impl: Impl, *inputs: torch.Tensor, **options: object) -> torch.Tensor:
    """impl(*inputs), skipping the test when the impl says it has no kernel for the case (a forced SDPA backend)."""
    try:
        return impl.fn(*inputs, **options)
    except NotRun as exc:
        pytest.skip(str(exc))


def _dtypes(op: Op, impl: Impl) -> list[torch.dtype]:
    if impl.compiled:
        return [torch.float32]  # one compile per case: the other dtypes are the naive impl's
    if DEVICE == "cpu" and impl.triton_kernels is not None:
        return [torch.float32]  # the Triton interpreter is exact in fp32 only
    return [d for d in op.dtypes if impl.dtypes is None or d in impl.dtypes]


def _shapes(op: Op, impl: Impl) -> list[tuple[int, ...]]:
    """On a GPU the op's check shapes (empty, odd, wide), on the CPU those of its quick report."""
    given = op.defaults.check_shapes if DEVICE == "cuda" else op.report_plan("quick")["check_shapes"]
    shapes = [tuple(s) for s in given]
    return shapes[:1] if impl.compiled else shapes


def _options(op: Op) -> dict:
    """The op's defaults with every option that has choices at its last choice (the non-default path too)."""
    return {k: (o.choices[-1] if o.choices else o.default) for k, o in op.options.items()}


@pytest.mark.parametrize(("op", "impl"), CASES)
def test_matches_float64_reference_with_gradients(op: Op, impl: Impl) -> None:
    _usable(impl)
    ran, not_run = 0, []
    for dtype in _dtypes(op, impl):
        for shape in _shapes(op, impl):
            for options in (op.default_options(), _options(op)):
                try:
                    row = check_case(op, impl, shape, dtype, DEVICE, options, fresh_seed())
                except NotRun as exc:  # the impl says it has no kernel for this case (a forced SDPA backend)
                    not_run.append(str(exc))
                    continue
                ran += 1
                tol = op.tolerance[dtype]
                assert row["rel_err"] <= tol, f"{dtype} {shape} {options}: rel err {row['rel_err']:.3g} > {tol}"
                if row["grad_rel_err"] is not None:
                    assert row["grad_rel_err"] <= tol, f"{dtype} {shape}: grad rel err {row['grad_rel_err']:.3g}"
                if impl.backward and all(shape) and shape:
                    assert row["grad_rel_err"] is not None
    if not ran:
        pytest.skip(f"no case ran: {not_run[0] if not_run else 'no dtype or shape to run'}")


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
    inputs = op.make_inputs(shape, _dtype(impl), DEVICE, fresh_seed(), **options)
    strided = [_strided(x) for x in inputs]
    if all(s.is_contiguous() for s in strided):
        pytest.skip(f"{op.name} shape {shape} has no dimension to stride")
    ref = op.reference(*(x.double() for x in inputs), **options)
    out = _run(impl, *strided, **options)
    assert relative_error(out, ref) <= op.tolerance[_dtype(impl)]


@pytest.mark.parametrize(("op", "impl"), [c for c in CASES if not c.values[1].compiled])
def test_nan_and_inf_inputs_follow_the_reference(op: Op, impl: Impl) -> None:
    _usable(impl)
    shape = max(_shapes(op, impl), key=lambda s: torch.Size(s).numel())
    options = op.default_options()
    inputs = list(op.make_inputs(shape, _dtype(impl), DEVICE, fresh_seed(), **options))
    first = inputs[0].clone()
    if first.numel() < 3:
        pytest.skip("too few elements to place NaN and infinities")
    flat = first.view(-1)
    flat[0], flat[flat.numel() // 2], flat[-1] = float("nan"), float("inf"), float("-inf")
    inputs[0] = first
    ref = op.reference(*(x.double() for x in inputs), **options)
    out = _run(impl, *inputs, **options)
    # relative_error is inf unless every non-finite reference entry is matched exactly (same NaN, same signed inf)
    assert relative_error(out, ref) <= op.tolerance[_dtype(impl)]


def _accepted(op: Op, impl: Impl) -> str:
    """The dtypes the impl declares (else its op's) as it lists them when refusing one: "float32, float16, bfloat16"."""
    return ", ".join(dtype_name(d) for d in impl.dtypes or op.dtypes)


@pytest.mark.parametrize(("op", "impl"), CASES)
def test_integer_input_is_refused_naming_the_accepted_dtypes(op: Op, impl: Impl) -> None:
    """The impl's own function (a compiled impl's too, uncompiled): a TypeError naming the dtype given and the dtypes
    it accepts, e.g. "dtype int64 is not supported; accepted: float32, float16, bfloat16"."""
    _usable(impl)
    options = op.default_options()
    inputs = op.make_inputs(_shapes(op, impl)[-1], torch.float32, DEVICE, fresh_seed(), **options)
    for dtype in (torch.int64, torch.int32):
        ints = [(x * 10).to(dtype) for x in inputs]
        with pytest.raises(TypeError) as info:
            impl.fn(*ints, **options)
        message = str(info.value)
        assert re.search(rf"dtype (torch\.)?{dtype_name(dtype)}\b", message), message
        assert message.startswith(f"{op.name} {impl.name}: "), message
        assert message.endswith(f" is not supported; accepted: {_accepted(op, impl)}"), message


def _device_cases() -> list:
    """(op, impl, device type) for every device type an impl does not list."""
    return [
        pytest.param(*c.values, device, id=f"{c.id}-{device}")
        for c in CASES
        for device in ("cpu", "cuda")
        if device not in c.values[1].devices
    ]


@pytest.mark.parametrize(("op", "impl", "device"), _device_cases())
def test_input_on_a_device_the_impl_does_not_run_on_is_refused(op: Op, impl: Impl, device: str) -> None:
    """E.g. a CUDA-only impl given CPU tensors (on a GPU machine too): a ValueError naming the impl, where the input
    is and where the impl runs, before anything is built or launched."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA GPU in this process")
    options = op.default_options()
    inputs = op.make_inputs(_shapes(op, impl)[-1], torch.float32, device, fresh_seed(), **options)
    with pytest.raises(ValueError) as info:
        impl.fn(*inputs, **options)
    message = str(info.value)
    assert message.startswith(f"{op.name} {impl.name}: "), message
    assert re.search(rf"is on {device}\b.*runs on {re.escape('/'.join(impl.devices))} only", message), message


@pytest.mark.parametrize(("op", "impl"), CASES)
def test_unavailability_is_explained(op: Op, impl: Impl) -> None:
    """unavailable(device) says why: a device the impl does not list, no GPU here; on the CPU every impl that lists
    it runs (Triton under its interpreter), or says how to make it run."""
    for device in ("cpu", "cuda"):
        reason = impl.unavailable(device)
        if device not in impl.devices:
            assert f"runs on {'/'.join(impl.devices)} only" in reason
        elif device == "cuda" and not torch.cuda.is_available():
            assert "no CUDA GPU" in reason
        elif device == "cpu" and impl.triton_kernels is not None and importlib.util.find_spec("triton") is None:
            assert "Triton is not installed" in reason
        elif device == "cpu" and impl.triton_kernels is not None and os.environ.get("TRITON_INTERPRET") != "1":
            assert "TRITON_INTERPRET=1" in reason
        elif device == "cpu":
            assert reason is None, reason


@pytest.mark.parametrize(
    ("op", "impl"), [c for c in CASES if c.values[1].triton_kernels and "cpu" in c.values[1].devices]
)
def test_triton_on_the_cpu_without_the_interpreter_says_why(
    op: Op, impl: Impl, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without TRITON_INTERPRET=1 (as on a GPU machine), CPU input is refused with the reason and the way out."""
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    reason = impl.unavailable("cpu")
    assert reason is not None and "TRITON_INTERPRET=1" in reason
    options = op.default_options()
    inputs = op.make_inputs(_shapes(op, impl)[-1], torch.float32, "cpu", fresh_seed(), **options)
    with pytest.raises(ValueError) as info:
        impl.fn(*inputs, **options)
    message = str(info.value)
    prefix = f"{op.name} {impl.name}: input is on cpu; move it with .to('cuda'). "
    assert message.startswith(prefix) and reason in message, message


@pytest.mark.parametrize(("op", "impl"), CASES)
def test_non_tensor_input_is_refused(op: Op, impl: Impl) -> None:
    """A list in place of any tensor input: a TypeError saying a tensor was expected (before any device check)."""
    options = op.default_options()
    inputs = op.make_inputs(_shapes(op, impl)[-1], torch.float32, "cpu", fresh_seed(), **options)
    for i in range(len(inputs)):
        args = [x.tolist() if j == i else x for j, x in enumerate(inputs)]
        with pytest.raises(TypeError, match=r"torch\.Tensor, got list"):
            impl.fn(*args, **options)


def _choice_cases() -> list:
    return [c for c in CASES if any(o.choices and o.kind is str for o in c.values[0].options.values())]


@pytest.mark.parametrize(("op", "impl"), _choice_cases())
def test_option_value_not_among_the_choices_is_refused(op: Op, impl: Impl) -> None:
    """A str option given a value it does not accept: a ValueError naming the value and the accepted ones."""
    _usable(impl)
    inputs = op.make_inputs(_shapes(op, impl)[-1], torch.float32, DEVICE, fresh_seed(), **op.default_options())
    for key, option in op.options.items():
        if option.choices and option.kind is str:
            accepted = ", ".join(repr(c) for c in option.choices)
            with pytest.raises(ValueError, match=rf"{key}='no-such-value'.*accepted: {re.escape(accepted)}"):
                impl.fn(*inputs, **{**op.default_options(), key: "no-such-value"})


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
def test_inputs_are_seeded_random_and_nonzero(op: Op) -> None:
    """make_inputs: the same seed the same inputs, another seed others; in the dtype asked, almost no zeros."""
    options = op.default_options()
    shape = max(_shapes(op, next(iter(op.impls.values()))), key=lambda s: torch.Size(s).numel())
    a, b, c = (op.make_inputs(shape, torch.bfloat16, "cpu", seed, **options) for seed in (7, 7, 8))
    for x, y, z in zip(a, b, c, strict=True):
        assert x.dtype == torch.bfloat16 and x.numel() > 100
        assert torch.equal(x, y) and not torch.equal(x, z)
        assert (x != 0).float().mean() > 0.99


@pytest.mark.parametrize("op", all_ops(), ids=lambda op: op.name)
def test_spec_is_complete(op: Op) -> None:
    """Inputs named, cost model positive, tolerances for every dtype, defaults for every tool."""
    shape = op.default_profile_shape()
    options = op.default_options()
    inputs = op.make_inputs(_shapes(op, next(iter(op.impls.values())))[-1], torch.float32, "cpu", 1, **options)
    assert len(inputs) == len(op.inputs) and all(not bool((x == 0).all()) for x in inputs if x.numel())
    assert op.bytes_moved(shape, torch.float32, **options) > 0 and op.flops(shape, **options) > 0
    assert set(op.dtypes) <= set(op.tolerance)
    assert op.defaults.baseline in op.impls
    for mode in ("quick", "cpu", "gpu"):
        plan = op.report_plan(mode)
        assert plan["check_shapes"] and plan["bench_sweeps"] and plan["x"] in ("numel", "width", "axis")


# ---------------------------------------------------------------------------------------------- custom ops


class FuselabCalls(TorchDispatchMode):
    """Records each fuselab custom op an impl calls (the first call of each): the op, detached clones of its
    arguments, whether it ran in the forward or in autograd's backward, and its output. While a dispatch mode is
    active the impls' eager fast path (FusedOp) goes through the dispatcher, so every registered op is seen."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[object, tuple[list, dict, bool]] = {}
        self.outputs: dict[object, object] = {}
        self.in_backward = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        first = func.namespace == "fuselab" and func not in self.calls
        if first:
            clone = [a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args]
            self.calls[func] = (clone, dict(kwargs), not self.in_backward)
        out = func(*args, **kwargs)
        if first:
            self.outputs[func] = out
        return out


def _small_shape(op: Op, impl: Impl) -> tuple[int, ...]:
    """The impl's smallest check shape with elements in every dimension."""
    return min((s for s in _shapes(op, impl) if s and all(s)), key=lambda s: torch.Size(s).numel())


def _option_sets(op: Op) -> list[dict]:
    """The op's default options, and (when it differs) every option with choices at its last choice."""
    sets = [op.default_options(), _options(op)]
    return sets[:1] if sets[0] == sets[1] else sets


def _fuselab_calls(op: Op, impl: Impl, dtype: torch.dtype, options: dict) -> FuselabCalls:
    """The fuselab ops one forward (and backward, if the impl has one) of `impl` calls on fresh random inputs."""
    inputs = op.make_inputs(_small_shape(op, impl), dtype, DEVICE, fresh_seed(), **options)
    xs = [x.requires_grad_(impl.backward) for x in inputs]
    recorder = FuselabCalls()
    with recorder:
        out = impl.fn(*xs, **options)
        if impl.backward:
            recorder.in_backward = True
            out.backward(torch.randn_like(out))
    return recorder


def _calls_fuselab_ops(op: Op, impl: Impl) -> None:
    """Skip unless the impl calls fuselab custom ops here."""
    _usable(impl)
    if impl.compiled:
        pytest.skip(f"{impl.name} is compiled by the harness; it calls no fuselab custom op of its own")
    if not _fuselab_calls(op, impl, _dtype(impl), op.default_options()).calls:
        pytest.skip(f"{op.name} {impl.name} calls no fuselab custom op")


@interpreter_quiet
@pytest.mark.parametrize(("op", "impl"), CASES)
def test_every_custom_op_an_impl_calls_passes_opcheck(op: Op, impl: Impl) -> None:
    """torch.library.opcheck (schema, fake tensor, autograd registration, AOT dispatch) on each fuselab op the
    impl's forward and backward call, with the arguments they were called with (forward ops' floating inputs
    requiring grad), in every dtype and for every option set."""
    _calls_fuselab_ops(op, impl)
    for dtype in _dtypes(op, impl):
        for options in _option_sets(op):
            recorder = _fuselab_calls(op, impl, dtype, options)
            if impl.backward:  # a fused forward comes with a fused backward
                assert any(forward for _, _, forward in recorder.calls.values()), recorder.calls
                assert any(not forward for _, _, forward in recorder.calls.values()), recorder.calls
            for func, (args, kwargs, forward) in recorder.calls.items():
                if forward:
                    args = [a.requires_grad_() if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                            for a in args]  # fmt: skip
                torch.library.opcheck(func, tuple(args), kwargs)


def _forward_backward(fn, inputs: list[torch.Tensor], dy: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    xs = [x.detach().clone().requires_grad_() for x in inputs]
    out = fn(*xs)
    out.backward(dy)
    return out.detach(), [x.grad for x in xs]


@interpreter_quiet
@pytest.mark.parametrize(("op", "impl"), CASES)
def test_impls_calling_custom_ops_compile_without_graph_breaks(op: Op, impl: Impl) -> None:
    """torch.compile(fullgraph=True) (Inductor; on the CPU its C++ backend) of a function using the impl between
    other ops, as in a model: no graph break, and forward and input gradients as in eager mode (fp32: 1e-6; on a
    GPU bf16 too, within the op's tolerance and 1e-2)."""
    _calls_fuselab_ops(op, impl)
    options = op.default_options()
    dtypes = [torch.float32] + ([torch.bfloat16] if DEVICE == "cuda" and torch.bfloat16 in op.dtypes else [])
    for dtype in dtypes:
        inputs = list(op.make_inputs(_small_shape(op, impl), dtype, DEVICE, fresh_seed(), **options))

        def model(*xs: torch.Tensor) -> torch.Tensor:
            return impl.fn(*(x * 1.5 for x in xs), **options) * 0.5

        ref = op.reference(*(x.double() * 1.5 for x in inputs), **options)
        dy = randn(tuple(ref.shape), dtype, DEVICE, fresh_seed())
        eager, eager_grads = _forward_backward(model, inputs, dy)
        torch._dynamo.reset()
        out, grads = _forward_backward(torch.compile(model, fullgraph=True), inputs, dy)
        torch._dynamo.reset()
        tol = 1e-6 if dtype == torch.float32 else min(op.tolerance[dtype], 1e-2)
        assert out.dtype == dtype and relative_error(out, eager) <= tol, f"{dtype}: {relative_error(out, eager):.3g}"
        for name, g, e in zip(op.inputs, grads, eager_grads, strict=True):
            assert relative_error(g, e) <= tol, f"{dtype} d{name}: {relative_error(g, e):.3g}"


def _fake_like(x: torch.Tensor, dtype: torch.dtype, device: str) -> torch.Tensor:
    """A tensor of x's shape on `device` (fake, under FakeTensorMode), its last two dimensions transposed in memory."""
    if x.dim() < 2:
        return torch.empty(x.shape, dtype=dtype, device=device)
    return torch.empty((*x.shape[:-2], x.shape[-1], x.shape[-2]), dtype=dtype, device=device).transpose(-1, -2)


class _Ctx:
    """What a custom op's setup_context and backward use of autograd's ctx."""

    def save_for_backward(self, *tensors: torch.Tensor) -> None:
        self.saved_tensors = tensors

    def mark_non_differentiable(self, *tensors: torch.Tensor) -> None:
        pass


def _formula_gradients(recorder: FuselabCalls) -> None:
    """Each recorded forward op's registered autograd formula (setup_context, then backward, which calls the backward
    ops), run without autograd's engine (which would need the device of fake CUDA tensors): one gradient of each
    tensor input's shape."""
    from torch._library.custom_ops import OPDEFS

    for func, (args, _, _) in recorder.calls.items():
        opdef = OPDEFS[func._schema.name]
        if opdef._backward_fn is None:
            continue
        out = recorder.outputs[func]
        outs = out if isinstance(out, tuple) else (out,)
        ctx = _Ctx()
        opdef._setup_context_fn(ctx, tuple(args), out)
        grads = opdef._backward_fn(ctx, *(torch.empty_like(o) for o in outs))
        grads = grads if isinstance(grads, tuple) else (grads,)
        for a, g in zip(args, grads, strict=True):
            if isinstance(a, torch.Tensor):
                assert g is not None and g.shape == a.shape, (func, g, a.shape)


@pytest.mark.parametrize(("op", "impl"), [c for c in CASES if c.values[1].inspectable])
def test_fused_impls_trace_with_fake_tensors_on_every_device_they_list(op: Op, impl: Impl) -> None:
    """Under FakeTensorMode (as torch.compile traces), without the device or a build: on CUDA always, on the CPU where
    the impl runs here, non-contiguous input gives an output of the reference's shape, the input's dtype and device,
    contiguous; the backward gives gradients of the inputs' shapes (without a GPU, through the custom ops' autograd
    formulas); an integer input fails already while tracing, naming the accepted dtypes."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    if impl.unavailable(DEVICE) is None:  # else (a CUDA impl without a GPU, say) tried on fake tensors alone
        _calls_fuselab_ops(op, impl)
    options = op.default_options()
    real = op.make_inputs(_small_shape(op, impl), torch.float32, "cpu", fresh_seed(), **options)
    devices = [d for d in impl.devices if d == "cuda" or impl.unavailable(d) is None]
    for device in devices:
        engine = impl.backward and (device == "cpu" or torch.cuda.is_available())
        for dtype in op.dtypes:
            with FakeTensorMode():
                xs = [_fake_like(x, dtype, device).requires_grad_(engine) for x in real]
                assert xs[0].dim() < 2 or not xs[0].is_contiguous()
                ref = op.reference(*(x.detach().double() for x in xs), **options)
                with FuselabCalls() as recorder:
                    out = impl.fn(*xs, **options)
                assert (out.shape, out.dtype, out.device.type) == (ref.shape, dtype, device)
                assert out.is_contiguous(), out.stride()
                if engine:
                    grads = torch.autograd.grad(out, xs, torch.empty_like(out))
                    assert [g.shape for g in grads] == [x.shape for x in xs]
                elif impl.backward:
                    _formula_gradients(recorder)
                with pytest.raises(TypeError, match=rf"accepted: {re.escape(_accepted(op, impl))}$"):
                    impl.fn(*(_fake_like(x, torch.int32, device) for x in real), **options)


# ---------------------------------------------------------------------------------------------- nn modules

MODULE_CASES = [c for c in CASES if c.values[0].module is not None]


@pytest.mark.parametrize("op", [op for op in all_ops() if op.module is not None], ids=lambda op: op.name)
def test_module_refuses_an_unknown_impl_naming_the_known(op: Op) -> None:
    with pytest.raises(ValueError) as info:
        op.module(impl="no-such-impl")
    assert f"no impl 'no-such-impl'; known: {', '.join(op.impls)}" in str(info.value)


def _model(act: torch.nn.Module, dtype: torch.dtype, seed: int) -> torch.nn.Module:
    """Linear(33, 65), act, Linear(65, 7): the same parameters for the same seed."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(33, 65), act, torch.nn.Linear(65, 7)).to(DEVICE, dtype)


@interpreter_quiet
@pytest.mark.parametrize(("op", "impl"), MODULE_CASES)
def test_module_is_a_drop_in_for_its_torch_counterpart(op: Op, impl: Impl) -> None:
    """op.module(impl=...) in place of its PyTorch counterpart in a tiny model (configured alike, for every option
    set): the same outputs and parameter gradients within 4x the op's tolerance (every dtype on a GPU); an impl
    without a backward, the same outputs."""
    _usable(impl)
    for dtype in _dtypes(op, impl) if DEVICE == "cuda" else (_dtype(impl),):
        for options in _option_sets(op):
            x = randn((17, 33), dtype, DEVICE, fresh_seed())
            seed = fresh_seed()
            outs, grads = [], []
            if impl.compiled:
                torch._dynamo.reset()
            for act in op.module.drop_in_pair(impl.name, **options)[::-1]:  # the counterpart first
                model = _model(act, dtype, seed)
                with torch.set_grad_enabled(impl.backward):
                    y = model(x)
                outs.append(y)
                if impl.backward:
                    y.square().sum().backward()
                    grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
            tol = 4 * op.tolerance[dtype]
            assert relative_error(outs[1], outs[0]) <= tol, f"{dtype} {options}"
            if impl.backward:
                assert relative_error(grads[1], grads[0]) <= tol, f"{dtype} {options}"
    torch._dynamo.reset()
