"""GELU: what is particular to it: the spec, both forms, odd and empty shapes, non-contiguous input, special values,
gradients, the Triton kernel's bulk and tail blocks and row strides, > 2^31 elements. What every op must do (dtype,
device and bad-input errors, opcheck of the custom ops, fullgraph compile, fake tensors, the nn module as a drop-in,
every impl x dtype x form on a GPU) is tests/ops/test_contract.py's.

On the CPU: naive, torch, compile and triton (under Triton's interpreter, fp32, small sizes) run; cuda reports
itself unavailable. GPU tests (`pytest -m gpu`) cover misaligned views, special values, the compiled impl, and > 2^31
elements (marked slow too).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import fuselab  # noqa: F401  (TRITON_INTERPRET=1 without a GPU, before any kernel is defined)
from fuselab.bench.accuracy import poison_allocator
from fuselab.bench.accuracy import relative_error as rel_err
from fuselab.ops import get_op
from fuselab.ops.gelu import GELU
from fuselab.ops.gelu.module import GELU as GELUModule
from fuselab.ops.gelu.spec import FORMS, reference

DTYPES = GELU.dtypes  # fp32, fp16, bf16
EAGER_IMPLS = ("naive", "torch", "triton", "cuda")  # GPU tests; the compiled impl has its own (compiling costs)
FUSED = ("triton", "cuda")  # the impls with their own backward kernels
# The interpreter computes exp2 in numpy, which warns where exp2 overflows to inf (the kernel wants the inf).
interpreter_quiet = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def run(name: str, x: torch.Tensor, approximate: str) -> torch.Tensor:
    """impl `name` on x; the compiled impl is compiled afresh (static shapes), as the harness does per case."""
    impl = GELU.get_impl(name)
    if impl.compiled:
        torch._dynamo.reset()
        return torch.compile(impl.fn, dynamic=False)(x, approximate=approximate)
    return impl(x, approximate=approximate)


def check_against_reference(name: str, shape: tuple[int, ...], dtype: torch.dtype, device: str, form: str) -> None:
    (x,) = GELU.make_inputs(shape, dtype, device, 0)
    poison_allocator(x.numel() * x.element_size(), device)  # unwritten output elements would show as NaN
    out = run(name, x, form)
    assert out.shape == x.shape and out.dtype == dtype and out.device == x.device
    err = rel_err(out, reference(x, form))
    assert err <= GELU.tolerance[dtype], f"{name} {form} {dtype} {shape}: rel err {err:.2e}"


def reference_grad(x: torch.Tensor, dy: torch.Tensor, form: str) -> torch.Tensor:
    """d(sum(dy * gelu(x)))/dx in float64."""
    x64 = x.detach().double().requires_grad_()
    (grad,) = torch.autograd.grad(reference(x64, form), x64, dy.double())
    return grad


def special_values(dtype: torch.dtype, device: str) -> torch.Tensor:
    """NaN, +-inf, zeros and large values at scattered positions of 4097 random ones (vector bodies and tails)."""
    (x,) = GELU.make_inputs((4097,), torch.float32, device, 1)
    specials = [float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 1e4, -1e4, 100.0, -100.0, -12.0]
    for i, v in enumerate(specials):
        x[(i * 409 + 3) % 4097] = v
    x[-1] = float("-inf")  # in the tail of any vectorized loop
    return x.to(dtype)


def assert_same_specials(out: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    for name, test in (("NaN", torch.isnan), ("+inf", torch.isposinf), ("-inf", torch.isneginf)):
        assert torch.equal(test(out), test(expected)), f"{what}: {name} at other positions than expected"


# ---------------------------------------------------------------------------------------------- the spec


def test_registered_impls() -> None:
    assert get_op("gelu") is GELU
    assert list(GELU.impls) == ["naive", "torch", "compile", "triton", "cuda"]
    assert [n for n, i in GELU.impls.items() if i.compiled] == ["compile"]
    assert all(GELU.impls[n].backward for n in FUSED)
    assert GELU.default_options() == {"approximate": "tanh"}


def test_inputs_are_spread() -> None:
    """Seeded, random and nonzero inputs are the contract test's; the spread is gelu's."""
    (x,) = GELU.make_inputs((3, 37, 129), torch.float32, "cpu", 7)
    assert x.std() > 2  # spread over both tails (GELU -> 0 and GELU -> x)


def test_cost_model() -> None:
    assert GELU.bytes_moved((2**24,), torch.float32) == 2 * 4 * 2**24
    assert GELU.bytes_moved((3, 5), torch.bfloat16) == 2 * 2 * 15
    assert GELU.flops((4, 5)) == 9 * 20


@pytest.mark.parametrize("form", FORMS)
def test_reference_is_f_gelu_in_float64(form: str) -> None:
    (x,) = GELU.make_inputs((10007,), torch.float64, "cpu", 3)
    ref = reference(x, form)
    assert ref.dtype == torch.float64
    assert rel_err(F.gelu(x, approximate=form), ref) < 1e-14
    assert rel_err(reference(x, "tanh"), reference(x, "none")) > 1e-5  # the forms differ


# ---------------------------------------------------------------------------------------------- CPU runs


@interpreter_quiet
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("shape", GELU.defaults.check_shapes, ids=str)
@pytest.mark.parametrize("name", ["naive", "torch", "triton"])
def test_cpu_fp32_matches_reference(name: str, shape: tuple[int, ...], form: str) -> None:
    check_against_reference(name, shape, torch.float32, "cpu", form)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("shape", [(1023,), (3, 37, 129)], ids=str)
def test_cpu_compile_matches_reference(shape: tuple[int, ...], form: str) -> None:
    check_against_reference("compile", shape, torch.float32, "cpu", form)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", ["naive", "torch"])
def test_cpu_half_precision(name: str, dtype: torch.dtype) -> None:
    for form in FORMS:
        check_against_reference(name, (4097,), dtype, "cpu", form)


@interpreter_quiet
@pytest.mark.parametrize("name", ["naive", "torch", "compile", "triton"])
def test_cpu_non_contiguous(name: str) -> None:
    (x,) = GELU.make_inputs((37, 129), torch.float32, "cpu", 2)
    for view in (x.t(), x[:, ::3], x[1:, 5:-7]):
        assert not view.is_contiguous()
        for form in FORMS:
            out = run(name, view, form)
            assert out.shape == view.shape
            assert rel_err(out, reference(view, form)) <= GELU.tolerance[torch.float32]


@interpreter_quiet
@pytest.mark.parametrize("name", ["naive", "compile", "triton"])
def test_cpu_special_values_as_f_gelu(name: str) -> None:
    """NaN -> NaN, +inf -> +inf, -inf -> NaN: what F.gelu gives on the GPU and in float64 on the CPU. (F.gelu's
    vectorized fp32 CPU kernel gives NaN for +inf too, so the torch impl is checked on the GPU only.)"""
    x = special_values(torch.float32, "cpu")
    for form in FORMS:
        out = run(name, x, form)
        assert_same_specials(out, reference(x, form), f"{name} {form}")
        assert_same_specials(out, F.gelu(x.double(), approximate=form), f"{name} {form} vs F.gelu")
        finite = torch.isfinite(x)
        assert rel_err(out[finite], reference(x[finite], form)) <= GELU.tolerance[torch.float32]


@interpreter_quiet
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("name", ["naive", "torch", "triton"])
def test_cpu_gradient_matches_reference(name: str, form: str) -> None:
    (x,) = GELU.make_inputs((3, 37, 129), torch.float32, "cpu", 4)
    (dy,) = GELU.make_inputs((3, 37, 129), torch.float32, "cpu", 5)
    x.requires_grad_()
    run(name, x, form).backward(dy)
    assert rel_err(x.grad, reference_grad(x, dy, form)) <= GELU.tolerance[torch.float32]


@interpreter_quiet
def test_cpu_triton_gradient_non_contiguous_upstream() -> None:
    """y.sum() sends back a stride-0 (expanded) gradient; the backward kernel must take it."""
    (x,) = GELU.make_inputs((129, 37), torch.float32, "cpu", 6)
    x = x.t().requires_grad_()
    run("triton", x, "tanh").sum().backward()
    assert rel_err(x.grad, reference_grad(x, torch.ones_like(x), "tanh")) <= GELU.tolerance[torch.float32]


@interpreter_quiet
def test_cpu_empty() -> None:
    for name in ("naive", "torch", "triton"):
        x = torch.empty(0, 5, requires_grad=True)
        out = run(name, x, "tanh")
        assert out.shape == (0, 5)
        out.sum().backward()
        assert x.grad.shape == (0, 5)


# ---------------------------------------------------------------------------------------------- nn.GELU
# (the contract test checks every impl as a drop-in)


def test_module_form_and_repr() -> None:
    """torch.nn.GELU's signature: the form first, unknown forms refused with the accepted ones."""
    with pytest.raises(ValueError, match="accepted: 'tanh', 'none'"):
        GELUModule(approximate="exact")
    assert repr(GELUModule("none", impl="torch")) == "GELU(approximate='none', impl='torch')"
    assert GELUModule().approximate == torch.nn.GELU().approximate == "none"


def test_module_default_runs_the_native_impl_of_the_device_and_a_named_interpreted_one_warns_once(monkeypatch) -> None:
    """impl="auto" (the default): PyTorch's F.gelu on the CPU, where Triton only interprets, the fused Triton
    kernel on a GPU; its repr says which. impl="triton" on the CPU works and warns once that it is interpreted."""
    import warnings

    from fuselab.ops import registry

    monkeypatch.setattr(registry, "_WARNED", set())  # once a process: as in a fresh one

    auto = GELUModule()
    on_gpu = "triton" if torch.cuda.is_available() else "torch"
    assert repr(auto) == (
        f"GELU(approximate='none', impl='auto' (torch on cpu, {on_gpu} on cuda, torch under torch.compile))"
    )
    x = torch.randn(1000, generator=torch.Generator().manual_seed(3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the native impl warns of nothing
        torch.testing.assert_close(auto(x), torch.nn.functional.gelu(x), rtol=0, atol=0)
    named = GELUModule(impl="triton")
    with pytest.warns(UserWarning, match="runs under Triton's interpreter.*impl='torch'") as caught:
        named(x[:64])
        named(x[:64])
    assert len([w for w in caught if "interpreter" in str(w.message)]) == 1


def test_the_compile_impl_takes_float64_as_it_declares() -> None:
    """impl "compile" declares float64 (so does fuselab.nn.GELU's docstring), but it called the naive impl, whose input
    check refused float64 ("gelu naive: dtype float64 is not supported", until 2026-12-05). Eager and as the module
    runs it (in torch.compile), both forms, against F.gelu in float64."""
    x = 4 * torch.randn(3, 257, dtype=torch.float64, generator=torch.Generator().manual_seed(11))
    for form in FORMS:
        expected = F.gelu(x, approximate=form)
        torch.testing.assert_close(GELU.get_impl("compile").fn(x, form), expected, rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(GELUModule(form, impl="compile")(x), expected, rtol=1e-12, atol=1e-14)


# ---------------------------------------------------------------------------------------------- GPU
# (the contract test covers every impl x dtype x form with gradients, opcheck and compile)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", EAGER_IMPLS)
def test_gpu_non_contiguous_and_misaligned(name: str, dtype: torch.dtype) -> None:
    """Transposed, permuted and strided views (narrow and wide rows, a stride through 1-D), and contiguous views 1 and
    3 elements into their storage (not 16-byte aligned): forward and backward, laid out as F.gelu lays them out."""
    (x,) = GELU.make_inputs((129, 371), dtype, "cuda", 2)
    (cube,) = GELU.make_inputs((5, 3, 67), dtype, "cuda", 3)
    flat = x.flatten()
    views = (x.t(), x[:, ::3], x[1:, 5:-7], x[:, :5], x[:, 7:8], flat[1:], flat[3:-2], flat[::2], cube.permute(2, 0, 1))
    for view in views:
        (dy,) = GELU.make_inputs(view.shape, dtype, "cuda", 4)
        for form in FORMS:
            leaf = view.detach().requires_grad_()
            out = run(name, leaf, form)
            assert out.shape == view.shape and out.dtype == dtype
            assert rel_err(out, reference(view, form)) <= GELU.tolerance[dtype], f"{name} {form} {view.stride()}"
            if name in FUSED:
                assert out.stride() == F.gelu(view).stride(), f"{name}: laid out unlike F.gelu's"
                out.backward(dy)
                assert rel_err(leaf.grad, reference_grad(view, dy, form)) <= GELU.tolerance[dtype], f"{name} grad"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", EAGER_IMPLS)
def test_gpu_special_values_as_f_gelu(name: str, dtype: torch.dtype) -> None:
    for x in (special_values(dtype, "cuda"), special_values(dtype, "cuda")[1:]):  # aligned and misaligned
        for form in FORMS:
            out = run(name, x, form)
            assert_same_specials(out, F.gelu(x, approximate=form), f"{name} {form} {dtype}")


@pytest.mark.gpu
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gpu_compile_impl(dtype: torch.dtype, form: str) -> None:
    """The compiled impl, with few compilations (each costs seconds): special values among random ones, forward
    and gradient, then a transposed input. `fuselab check gelu` covers it at every check shape."""
    x = special_values(dtype, "cuda").requires_grad_()
    (dy,) = GELU.make_inputs(x.shape, dtype, "cuda", 5)
    out = run("compile", x, form)
    assert_same_specials(out, F.gelu(x, approximate=form), f"compile {form} {dtype}")
    assert rel_err(out, reference(x, form)) <= GELU.tolerance[dtype]  # finite entries; non-finite must match
    out.backward(dy)
    finite = torch.isfinite(x)
    assert rel_err(x.grad[finite], reference_grad(x, dy, form)[finite]) <= GELU.tolerance[dtype]
    (y,) = GELU.make_inputs((37, 129), dtype, "cuda", 2)
    assert rel_err(run("compile", y.t(), form), reference(y.t(), form)) <= GELU.tolerance[dtype]


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.usefixtures("whole_gpu_memory")
@pytest.mark.parametrize("name", FUSED)
def test_gpu_past_2_pow_31_elements(name: str) -> None:
    """2^31 + 17 bf16 elements (4 GiB): 64-bit offsets in forward and backward; checked on slices at the start,
    across the 2^31 boundary, at the very end, and on a stride through the whole tensor."""
    n = 2**31 + 17
    if torch.cuda.get_device_properties(0).total_memory < 40 * 2**30:
        pytest.skip("needs ~30 GiB of GPU memory")
    (x,) = GELU.make_inputs((n,), torch.bfloat16, "cuda", 11)
    impl = GELU.get_impl(name)
    op_backward = getattr(torch.ops.fuselab, f"gelu_{name}_backward")
    y = impl(x, approximate="tanh")
    dx = op_backward(torch.ones_like(x), x, "tanh")
    tol = GELU.tolerance[torch.bfloat16]
    for part in (slice(0, 4097), slice(2**31 - 4096, 2**31 + 4096), slice(n - 4097, n), slice(0, n, 65537)):
        assert rel_err(y[part], reference(x[part], "tanh")) <= tol, f"forward at {part}"
        ref_grad = reference_grad(x[part], torch.ones_like(x[part]), "tanh")
        assert rel_err(dx[part], ref_grad) <= tol, f"backward at {part}"


# ---------------------------------------------------------------------------------------------- bulk and tail


@interpreter_quiet
@pytest.mark.parametrize("n", [17, 1023, 4097 + 3])
@pytest.mark.parametrize("form", FORMS)
def test_cpu_triton_bulk_and_tail(n: int, form: str) -> None:
    """With 16-element blocks, n = 17, 1023, 4100 run unmasked (bulk) blocks and a masked last block; with the
    default block, n = 17 is the tail alone. Forward and backward against float64, into NaN-poisoned memory."""
    from fuselab.ops.gelu import triton_kernels as tk

    (x,) = GELU.make_inputs((n,), torch.float32, "cpu", n)
    (dy,) = GELU.make_inputs((n,), torch.float32, "cpu", n + 1)
    for config in ((16, 1), None):
        poison_allocator(x.numel() * 4, "cpu")
        y = tk.gelu_forward(x, form == "tanh", config)
        assert rel_err(y, reference(x, form)) <= GELU.tolerance[torch.float32], f"{n} {config}"
    dx = tk.gelu_backward(dy, x, form == "tanh")
    assert rel_err(dx, dy.double() * reference_grad(x, torch.ones_like(dy), form)) <= GELU.tolerance[torch.float32]


@interpreter_quiet
def test_cpu_triton_reads_layouts_in_place() -> None:
    """A slice x[:, :k] of wider rows is read through its row stride in tiles (bulk and ragged tiles, with 16-element
    blocks and the default), with no copy (rows_view keeps the view); a transposed (dense) input keeps its strides
    in the output, as F.gelu's; an input strided unlike the other, and a stride-0 row, are read through theirs."""
    from fuselab.ops.gelu import triton_kernels as tk

    (wide,) = GELU.make_inputs((5, 1031), torch.float32, "cpu", 3)
    x = wide[:, :1030]
    assert tk.rows_view(x) == (5, 1030, 1031, 1)
    assert tk.rows_view(wide.view(5, 1, 1031)[:, :, 3:]) == (5, 1028, 1031, 1)
    assert tk.rows_view(wide.view(5, 1031, 1).transpose(0, 1)[:7]) is None  # leading dims that do not merge
    for config in ((16, 1), None):
        y = tk.gelu_forward(x, True, config)
        assert y.is_contiguous() and rel_err(y, reference(x)) <= GELU.tolerance[torch.float32]
    y = tk.gelu_forward(wide.t(), True)
    assert y.stride() == wide.t().stride() and rel_err(y, reference(wide.t())) <= GELU.tolerance[torch.float32]
    (dy,) = GELU.make_inputs((1030, 5), torch.float32, "cpu", 4)
    dx = tk.gelu_backward(dy.t(), x, True)  # one input strided, the other transposed
    assert rel_err(dx, reference_grad(x, dy.t(), "tanh")) <= GELU.tolerance[torch.float32]
    expanded = wide[:1, :300].expand(4, 300)  # row stride 0
    assert rel_err(tk.gelu_forward(expanded, False), reference(expanded, "none")) <= GELU.tolerance[torch.float32]


@interpreter_quiet
@pytest.mark.parametrize("width", [1, 5, 17, 300])
def test_cpu_triton_narrow_rows_in_tiles(width: int) -> None:
    """Rows narrower than a block go many to a tile: sliced rows of odd stride, a stride through 1-D, a permuted
    3-D tensor, with as many rows as leave a ragged last tile; forward and backward against float64."""
    from fuselab.ops.gelu import triton_kernels as tk

    rows = 4 * (16 // min(16, triton_block_c(width))) + 3  # 4 tiles of 16-element blocks and a ragged one
    (base,) = GELU.make_inputs((rows, width + 3), torch.float32, "cpu", width)
    (flat,) = GELU.make_inputs((2 * rows * width,), torch.float32, "cpu", width + 1)
    (cube,) = GELU.make_inputs((3, width, 7), torch.float32, "cpu", width + 2)
    for x in (base[:, :width], flat[::2], cube.permute(2, 0, 1), cube.transpose(0, 1)):
        (dy,) = GELU.make_inputs(x.shape, torch.float32, "cpu", 9)
        for config in ((16, 1), None):
            y = tk.gelu_forward(x, True, config)
            err = rel_err(y, reference(x))
            assert y.shape == x.shape and err <= GELU.tolerance[torch.float32], (x.stride(), config)
        assert y.stride() == torch.empty_like(x).stride()
        dx = tk.gelu_backward(dy, x, False)
        assert dx.stride() == torch.empty_like(x).stride()
        assert rel_err(dx, reference_grad(x, dy, "none")) <= GELU.tolerance[torch.float32], x.stride()


def triton_block_c(width: int) -> int:
    """The columns of a rows tile for rows of `width`: the width rounded up to a power of two."""
    return 1 << (width - 1).bit_length()
