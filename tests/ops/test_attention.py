"""Attention: every impl against the float64 reference at odd sizes (forward and gradients), the CS336 autograd
interface, determinism, bad input; Triton under the CPU interpreter in fp32 at tiny sizes, all dtypes on a GPU."""

from __future__ import annotations

import os

import pytest
import torch

from fuselab.ops.attention import ATTENTION, FlashAttentionTiled, attention
from fuselab.ops.attention.spec import flops, reference
from fuselab.ops.evaluate import relative_error

HAS_CUDA = torch.cuda.is_available()
TRITON_OK = HAS_CUDA or os.environ.get("TRITON_INTERPRET") == "1"

# (shape descriptor): 3-D, 4-D, Nq != Nk, GQA; N 1, 17, 65, 130; d 16, 48, 80
CPU_SHAPES = [(2, 1, 16), (2, 17, 16), (1, 2, 65, 33, 48), (1, 4, 2, 17, 40, 80), (1, 2, 130, 130, 16)]


def inputs(shape: tuple, dtype: torch.dtype, device: str, seed: int = 0) -> tuple[torch.Tensor, ...]:
    return ATTENTION.make_inputs(shape, dtype, device, seed + sum(shape) * 31 + len(shape))


def check_against_reference(impl: str, shape: tuple, causal: bool, dtype: torch.dtype, device: str) -> None:
    q, k, v = inputs(shape, dtype, device)
    xs = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out = attention(*xs, causal=causal, impl=impl)
    assert out.shape == q.shape and out.dtype == dtype
    gen = torch.Generator(device="cpu").manual_seed(7)
    dout = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    out.backward(dout.to(device=device, dtype=dtype))
    xs64 = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
    ref = reference(*xs64, causal=causal)
    ref.backward(dout.to(device))
    tol = ATTENTION.tolerance[dtype]
    assert relative_error(out, ref) < tol, (impl, shape, causal)
    for name, a, b in zip("qkv", xs, xs64, strict=True):
        assert relative_error(a.grad, b.grad) < tol, (impl, shape, causal, name)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", CPU_SHAPES)
@pytest.mark.parametrize("impl", ["naive", "sdpa", "tiled"])
def test_cpu_impls_match_reference(impl: str, shape: tuple, causal: bool) -> None:
    check_against_reference(impl, shape, causal, torch.float32, "cpu")


def test_reference_is_softmax_of_scores_with_top_left_mask() -> None:
    q, k, v = inputs((1, 1, 5, 7, 8), torch.float64, "cpu")
    out = reference(q, k, v, causal=True, scale=0.3)
    # query 0 sees key 0 only: its output is v's row 0
    torch.testing.assert_close(out[0, 0, 0], v[0, 0, 0])
    s = (q[0, 0, 2] @ k[0, 0, :3].T) * 0.3
    torch.testing.assert_close(out[0, 0, 2], torch.softmax(s, -1) @ v[0, 0, :3])


def test_cost_model_follows_the_papers() -> None:
    assert flops((2, 3, 100, 16)) == 4 * 2 * 3 * 100 * 100 * 16
    assert flops((2, 3, 100, 16), causal=True) == 2 * 2 * 3 * 100 * 100 * 16
    assert flops((2, 3, 100, 16), backward=True) == int(3.5 * 4 * 2 * 3 * 100 * 100 * 16)
    assert ATTENTION.bytes_moved((2, 4, 2, 10, 20, 8), torch.bfloat16) == (2 * 2 * 4 * 10 * 8 + 2 * 2 * 2 * 20 * 8) * 2


def test_tiled_function_saves_q_k_v_o_and_logsumexp() -> None:
    q, k, v = (t.requires_grad_(True) for t in inputs((2, 70, 16), torch.float32, "cpu"))
    out = FlashAttentionTiled.apply(q, k, v, True)
    saved = out.grad_fn.saved_tensors
    assert len(saved) == 5
    assert [tuple(t.shape) for t in saved[:4]] == [(2, 70, 16)] * 4
    lse = saved[4]
    assert lse.shape == (2, 70) and lse.dtype == torch.float32
    s = (q.double() @ k.double().transpose(1, 2)) / 4.0
    s = s.masked_fill(torch.ones(70, 70, dtype=torch.bool).tril().logical_not(), float("-inf"))
    torch.testing.assert_close(lse.double(), torch.logsumexp(s, dim=-1), rtol=1e-5, atol=1e-5)


def test_tiled_backward_is_deterministic() -> None:
    q, k, v = inputs((1, 2, 90, 75, 16), torch.float32, "cpu")
    grads = []
    for _ in range(2):
        xs = [t.clone().requires_grad_(True) for t in (q, k, v)]
        attention(*xs, causal=True, impl="tiled").sum().backward()
        grads.append([x.grad for x in xs])
    for a, b in zip(*grads, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize(
    ("q", "k", "v", "kind", "match"),
    [
        ((2, 3, 8, 16), (3, 3, 8, 16), (3, 3, 8, 16), ValueError, "batch dims differ"),
        ((2, 3, 8, 16), (2, 2, 8, 16), (2, 2, 8, 16), ValueError, "multiple of"),
        ((2, 4, 8, 16), (2, 2, 8, 32), (2, 2, 8, 32), ValueError, "head dim"),
        ((2, 4, 8, 16), (2, 2, 8, 16), (2, 2, 9, 16), ValueError, "same shape"),
        ((2, 8, 16), (2, 2, 8, 16), (2, 2, 8, 16), ValueError, "one rank"),
    ],
)
@pytest.mark.parametrize("impl", ["naive", "tiled", "triton"])
def test_bad_shapes_are_named(impl: str, q: tuple, k: tuple, v: tuple, kind: type, match: str) -> None:
    if impl == "triton" and not TRITON_OK:
        pytest.skip("no Triton here")
    device = "cuda" if HAS_CUDA else "cpu"
    with pytest.raises(kind, match=match):
        tensors = [torch.randn(size, device=device) for size in (q, k, v)]
        attention(*tensors, impl=impl)


@pytest.mark.parametrize("impl", ["naive", "tiled", "triton"])
def test_bad_dtypes_and_devices_are_named(impl: str) -> None:
    q = torch.randn(1, 2, 8, 16)
    with pytest.raises(TypeError, match="share one dtype"):
        attention(q, q.double(), q, impl=impl)
    with pytest.raises(TypeError, match="floating"):
        attention(q.long(), q.long(), q.long(), impl=impl)
    if HAS_CUDA:
        with pytest.raises(ValueError, match="one device"):
            attention(q.cuda(), q, q, impl=impl)
    with pytest.raises(TypeError, match=r"torch\.Tensor"):
        attention([1.0], q, q, impl=impl)


def test_unknown_impl_lists_the_known_ones() -> None:
    q = torch.randn(1, 4, 8)
    with pytest.raises(ValueError, match=r"known: .*tiled"):
        attention(q, q, q, impl="flash9")


def test_sdpa_backends_say_why_unavailable_on_cpu() -> None:
    for name in ("sdpa-flash", "sdpa-cudnn", "sdpa-efficient"):
        assert "cuda" in ATTENTION.get_impl(name).unavailable("cpu").lower()
