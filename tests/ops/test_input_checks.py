"""The input checks Op.impl applies from what an Impl declares (devices, dtypes, min_dim): on the function the impl
registers, so fuselab.nn and a user calling it directly get them, with no check_tensor in the impl's body."""

from __future__ import annotations

import math

import pytest
import torch

import fuselab  # noqa: F401  (TRITON_INTERPRET=1 without a GPU, before any kernel is defined)
from fuselab.ops import get_op
from fuselab.ops.registry import Op


def _inputs(op_name: str) -> list[torch.Tensor]:
    shape = {"gelu": (3, 5), "softmax": (3, 5), "attention": (1, 2, 4, 8)}[op_name]
    return [torch.randn(shape) for _ in get_op(op_name).inputs]


@pytest.mark.parametrize(("op_name", "impl"), [("gelu", "naive"), ("softmax", "torch"), ("attention", "naive")])
def test_a_non_tensor_is_refused_naming_the_input(op_name: str, impl: str) -> None:
    """One input: "expected a torch.Tensor"; several: the one refused is named."""
    op = get_op(op_name)
    for i, name in enumerate(op.inputs):
        args = [x.tolist() if j == i else x for j, x in enumerate(_inputs(op_name))]
        expected = f"{name} must be" if len(op.inputs) > 1 else "expected"
        with pytest.raises(TypeError, match=rf"^{op_name} {impl}: {expected} a torch\.Tensor, got list$"):
            op.get_impl(impl).fn(*args)


@pytest.mark.parametrize(
    ("op_name", "impl", "accepted"),
    [
        ("gelu", "naive", "float32, float16, bfloat16"),
        ("gelu", "torch", "float32, float16, bfloat16, float64"),
        ("softmax", "naive", "float32, float16, bfloat16"),
        ("attention", "tiled", "float32, float16, bfloat16, float64"),
    ],
)
def test_a_dtype_not_declared_is_refused_naming_the_accepted(op_name: str, impl: str, accepted: str) -> None:
    op = get_op(op_name)
    args = _inputs(op_name)
    args[-1] = args[-1].to(torch.int32)
    of = f" of {op.inputs[-1]}" if len(op.inputs) > 1 else ""
    with pytest.raises(TypeError, match=rf"^{op_name} {impl}: dtype int32{of} is not supported; accepted: {accepted}$"):
        op.get_impl(impl).fn(*args)


@pytest.mark.parametrize(("op_name", "impl"), [("gelu", "cuda"), ("softmax", "cuda"), ("attention", "sdpa-flash")])
def test_a_device_not_declared_is_refused_saying_how_to_move(op_name: str, impl: str) -> None:
    op = get_op(op_name)
    first = op.inputs[0] if len(op.inputs) > 1 else "input"
    where = "is on cpu, but this implementation runs on cuda only"
    message = rf"^{op_name} {impl}: {first} {where}; move it with \.to\('cuda'\)$"
    with pytest.raises(ValueError, match=message):
        op.get_impl(impl).fn(*(x.half() for x in _inputs(op_name)))


def test_attention_needs_three_dims_and_gelu_softmax_take_a_scalar() -> None:
    q = torch.randn(4, 8)
    with pytest.raises(
        ValueError, match=r"^attention naive: expected q with at least 3 dimension\(s\), got shape \(4, 8\)$"
    ):
        get_op("attention").get_impl("naive").fn(q, q, q)
    x = torch.tensor(0.5)
    assert torch.allclose(get_op("gelu").get_impl("naive").fn(x), get_op("gelu").reference(x.double()).float())
    assert get_op("softmax").get_impl("naive").fn(x).item() == 1.0


def test_inputs_given_by_keyword_are_checked_too() -> None:
    fn = get_op("gelu").get_impl("naive").fn
    assert fn(x=torch.ones(3)).shape == (3,)
    with pytest.raises(TypeError, match=r"^gelu naive: dtype int64 is not supported"):
        fn(x=torch.ones(3, dtype=torch.int64))


def _toy(calls: list[str]) -> Op:
    """An op of two inputs whose impls declare what they accept and check nothing themselves."""
    op = Op(
        name="input_checks_toy",
        inputs=("a", "b"),
        reference=lambda a, b: a + b,
        make_inputs=lambda shape, dtype, device, seed: (torch.ones(shape, dtype=dtype, device=device),) * 2,
        bytes_moved=lambda shape, dtype: 3 * math.prod(shape) * dtype.itemsize,
        flops=lambda shape: math.prod(shape),
        tolerance={torch.float32: 1e-6},
    )

    @op.impl("fp32", devices=("cpu",), dtypes=(torch.float32,), min_dim=1)
    def add(a: torch.Tensor, b: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        """a + scale * b."""
        calls.append("add")
        return a + scale * b

    return op


def test_a_toy_impl_gets_the_declared_check_without_calling_check_tensor() -> None:
    calls: list[str] = []
    op = _toy(calls)
    impl = op.get_impl("fp32")
    a = torch.ones(3)
    assert torch.equal(impl.fn(a, a, scale=2.0), torch.full((3,), 3.0)) and calls == ["add"]
    assert impl.doc == "a + scale * b." and impl.fn.__name__ == "add"
    with pytest.raises(
        TypeError, match=r"^input_checks_toy fp32: dtype float16 of b is not supported; accepted: float32$"
    ):
        impl.fn(a, a.half())
    with pytest.raises(TypeError, match=r"^input_checks_toy fp32: a must be a torch\.Tensor, got float$"):
        impl.fn(1.0, a)
    with pytest.raises(ValueError, match=r"^input_checks_toy fp32: expected b with at least 1 dimension"):
        impl.fn(a, torch.tensor(1.0))
    with pytest.raises(ValueError, match=r"^input_checks_toy fp32: a is on meta, but this implementation runs on cpu"):
        impl.fn(a.to("meta"), a)
    assert calls == ["add"]  # refused before the body ran


def test_the_check_traces_into_a_fullgraph_compile() -> None:
    fn = get_op("gelu").get_impl("naive").fn
    x = torch.randn(17)
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: fn(t, "none") * 2.0, fullgraph=True, backend="eager")
    assert torch.allclose(compiled(x), fn(x, "none") * 2.0)
    torch._dynamo.reset()


def test_the_cs336_function_checks_its_inputs_as_the_impl_does() -> None:
    from fuselab.ops.attention import FlashAttentionTiled

    q = torch.randn(1, 4, 8)
    with pytest.raises(TypeError, match=r"^FlashAttentionTiled: dtype int64 of k is not supported; accepted: float32"):
        FlashAttentionTiled.apply(q, q.long(), q)
    with pytest.raises(TypeError, match=r"q, k, v must share one dtype"):
        FlashAttentionTiled.apply(q, q.double(), q)


def test_every_impl_runs_every_dtype_it_declares_on_the_cpu() -> None:
    """Each impl available on the CPU, called on each dtype it declares (its own, else its op's) at a small odd shape,
    returns that dtype's result: a declared dtype another layer refuses is a defect. Found this way (2026-12-05): gelu
    "compile" declared float64 but called the naive impl, whose check refused it; attention "triton" declared float64,
    which its kernels cannot take (an AssertionError inside Triton)."""
    from fuselab.ops import all_ops

    ran = []
    for op in all_ops():
        shape = {"gelu": (3, 37), "softmax": (3, 37), "attention": (1, 2, 1, 19, 21, 16)}.get(op.name)
        if shape is None:  # an op registered by another test: not this test's
            continue
        options = op.default_options()
        for name, impl in op.impls.items():
            for dtype in impl.dtypes or op.dtypes:
                if impl.unavailable("cpu", dtype) is not None:
                    continue
                inputs = op.make_inputs(shape, dtype, "cpu", 5, **options)
                out = impl.fn(*inputs, **options)
                out = out[0] if isinstance(out, tuple) else out
                assert out.dtype == dtype and out.shape == inputs[0].shape, (op.name, name, dtype)
                ran.append((op.name, name, dtype))
    assert ("gelu", "compile", torch.float64) in ran and ("attention", "tiled", torch.float64) in ran, ran
