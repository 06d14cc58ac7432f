"""Attention: every impl against the float64 reference at odd sizes (forward and gradients), the CS336 autograd
interface, determinism, bad input; Triton under the CPU interpreter in fp32 at tiny sizes, all dtypes on a GPU."""

from __future__ import annotations

import functools
import os
import random

import pytest
import torch
import triton
import triton.language as tl

from fuselab.bench.accuracy import gradient_error, poison_allocator, relative_error
from fuselab.ops.attention import ATTENTION, FlashAttentionTiled, attention
from fuselab.ops.attention.spec import flops, reference
from fuselab.ops.attention.triton_kernels import _program

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
    err = gradient_error([x.grad for x in xs], [x.grad for x in xs64])  # dQ, dK, dV: the worst, each in its share
    assert err < tol, (impl, shape, causal, err, non_finite(xs))


def non_finite(xs: list[torch.Tensor]) -> dict[str, list]:
    """Where each of dQ, dK, dV holds NaN or inf: the (..., row, column) indices of the first and last, and how many
    (an intermittent failure's evidence, so that one run names the kernel that wrote them)."""
    found = {}
    for name, x in zip(("dq", "dk", "dv"), xs, strict=True):
        bad = (~torch.isfinite(x.grad)).nonzero()
        if len(bad):
            found[name] = [len(bad), bad[0].tolist(), bad[-1].tolist()]
    return found


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


@pytest.mark.parametrize("causal", [False, True])
def test_reference_made_a_block_of_queries_at_a_time_is_the_same(monkeypatch, causal: bool) -> None:
    """Past REFERENCE_SCORES the scores are made some queries at a time (here 5 of 37, the last block 2): the output
    and its gradients are those of the reference made at once, GQA and Nq != Nk included."""
    from fuselab.ops.attention import spec

    q, k, v = inputs((2, 4, 2, 37, 29, 16), torch.float64, "cpu")
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    whole = reference(*leaves, causal=causal, scale=0.3)
    grads = torch.autograd.grad(whole.sum(), leaves)
    monkeypatch.setattr(spec, "REFERENCE_SCORES", 2 * 4 * 29 * 5)
    blocked = reference(*leaves, causal=causal, scale=0.3)
    torch.testing.assert_close(blocked, whole, rtol=1e-12, atol=1e-12)
    for g, g_whole in zip(torch.autograd.grad(blocked.sum(), leaves), grads, strict=True):
        torch.testing.assert_close(g, g_whole, rtol=1e-12, atol=1e-12)
    monkeypatch.setattr(spec, "REFERENCE_SCORES", 1)  # one query at a time
    torch.testing.assert_close(reference(q, k, v, causal=causal, scale=0.3), whole.detach(), rtol=1e-12, atol=1e-12)


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
        attention(q, q.half(), q, impl=impl)
    accepted = "float32, float16, bfloat16" + ("" if impl == "triton" else ", float64")  # the kernels: no float64
    with pytest.raises(TypeError, match=rf"dtype int64 of q is not supported; accepted: {accepted}$"):
        attention(q.long(), q.long(), q.long(), impl=impl)
    if impl == "triton":  # refused by the input check, not an AssertionError inside the kernel
        with pytest.raises(TypeError, match=rf"dtype float64 of q is not supported; accepted: {accepted}$"):
            attention(q.double(), q.double(), q.double(), impl=impl)
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


# ---------------------------------------------------------------------------------------------- triton

needs_triton = pytest.mark.skipif(not TRITON_OK, reason="Triton needs a GPU or TRITON_INTERPRET=1")
DEVICE = "cuda" if HAS_CUDA else "cpu"
# the interpreter runs 16 x 16 tiles by default; these plans have BLOCK_M != BLOCK_N, as on a GPU
UNEVEN_PLANS = {"fwd": (32, 16), "dkdv": (16, 32), "dq": (32, 16)}


def _uneven_plans() -> dict:
    from fuselab.ops.attention.triton_kernels import Plan

    return {k: Plan(m, n, 4, 2) for k, (m, n) in UNEVEN_PLANS.items()}


@needs_triton
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(2, 1, 16), (2, 17, 16), (1, 2, 65, 33, 48), (1, 4, 2, 17, 40, 80)])
def test_triton_matches_reference(shape: tuple, causal: bool) -> None:
    check_against_reference("triton", shape, causal, torch.float32, DEVICE)


def one_key_per_query_gradients(impl: str, shape: tuple, causal: bool, dtype: torch.dtype, device: str) -> None:
    """N = 1 (and causal rows that see one key): softmax over one score is 1 whatever q and k are, so dQ and dK are
    zero by the math and only rounding may remain, far under dV; dV is dO summed over the queries that see it."""
    q, k, v = inputs(shape, dtype, device)
    xs = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out = attention(*xs, causal=causal, impl=impl)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    out.backward(dout.to(device=device, dtype=dtype))
    xs64 = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
    reference(*xs64, causal=causal).backward(dout.to(device))
    tol = ATTENTION.tolerance[dtype]
    dq, dk, dv = (x.grad.double() for x in xs)
    assert all(torch.isfinite(g).all() for g in (dq, dk, dv)), non_finite(xs)
    assert dq.norm() <= tol * dv.norm() and dk.norm() <= tol * dv.norm(), (dq.norm(), dk.norm(), dv.norm())
    assert relative_error(dv, xs64[2].grad) < tol
    assert gradient_error([x.grad for x in xs], [x.grad for x in xs64]) < tol


@needs_triton
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(3, 2, 1, 1, 64), (2, 1, 16), (1, 2, 1, 1, 5, 24)])
def test_triton_one_key_per_query(shape: tuple, causal: bool) -> None:
    if shape[-3] != shape[-2] and not causal:
        pytest.skip("Nq = 1 < Nk without the causal mask sees every key")
    one_key_per_query_gradients("triton", shape, causal, torch.float32, DEVICE)


def sees_one_key(shape: tuple, causal: bool) -> bool:
    """Whether every query of `shape` sees one key alone: one key, or top-left causal with one query."""
    nq, nk = (shape[-2], shape[-2]) if len(shape) <= 4 else shape[-3:-1]
    return nk == 1 or (causal and nq == 1)


@needs_triton
def test_triton_random_small_shapes_match_reference() -> None:
    """Ten shapes drawn afresh each run (batch 1-2, GQA ratios 1-3, queries and keys 1-70 apart, head dims 8-96 in
    one or two chunks, causal or not): forward and dQ, dK, dV against float64. The draw's seed is in the message."""
    import random

    from fuselab.evaluate.cases import fresh_seed

    seed = fresh_seed()
    rng = random.Random(seed)
    for _ in range(10):
        hkv = rng.choice([1, 2])
        sizes = (rng.choice([1, 2]), hkv * rng.choice([1, 2, 3]), hkv, rng.randint(1, 70), rng.randint(1, 70))
        shape, causal = (*sizes, rng.choice([8, 16, 24, 40, 64, 80, 96])), rng.random() < 0.5
        try:
            if sees_one_key(shape, causal):
                one_key_per_query_gradients("triton", shape, causal, torch.float32, DEVICE)
            else:
                check_against_reference("triton", shape, causal, torch.float32, DEVICE)
        except AssertionError as e:
            raise AssertionError(f"seed {seed}: shape {shape}, causal={causal}: {e}") from e


@needs_triton
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(1, 1, 70, 45, 16), (1, 2, 1, 33, 66, 24), (1, 2, 2, 37, 29, 40)])
def test_triton_uneven_blocks_match_reference(shape: tuple, causal: bool) -> None:
    from fuselab.ops.attention.triton_kernels import forced_plans

    with forced_plans(_uneven_plans()):
        check_against_reference("triton", shape, causal, torch.float32, DEVICE)


@needs_triton
def test_triton_causal_backward_launches_only_keys_some_query_sees(monkeypatch) -> None:
    """12 queries over 70 keys, top-left causal: keys 12.. are seen by none, so their dK and dV are exact zeros and
    the dK/dV kernel is launched over the first 16-key block alone (of 5)."""
    from fuselab.ops.attention import triton_kernels as tk

    assert tk.seen_keys(12, 70, True) == 12 and tk.seen_keys(12, 70, False) == 70 and tk.seen_keys(70, 12, True) == 12
    launched, zeroed = [], []
    monkeypatch.setattr(tk, "attention_bwd_dkdv_kernel", _Recording(tk.attention_bwd_dkdv_kernel, launched))
    monkeypatch.setattr(tk, "attention_bwd_unseen_kernel", _Recording(tk.attention_bwd_unseen_kernel, zeroed))
    with tk.forced_plans({"dkdv": tk.Plan(16, 16, 1, 1)}):
        check_against_reference("triton", (2, 3, 12, 70, 24), True, torch.float32, DEVICE)
        q, k, v = inputs((1, 2, 12, 70, 24), torch.float32, DEVICE)
        k.requires_grad_(True), v.requires_grad_(True)
        attention(q, k, v, causal=True, impl="triton").square().sum().backward()
    assert launched == [(6, 1), (2, 1)]  # one key block x (batch x heads), one share of the queries
    assert zeroed == [(21,), (7,)]  # the 54 keys past that block x (batch x heads), 16 rows a program
    assert k.grad[..., 12:, :].count_nonzero() == 0 and v.grad[..., 12:, :].count_nonzero() == 0
    assert k.grad[..., :12, :].count_nonzero() > 0 and v.grad[..., :12, :].count_nonzero() > 0


@needs_triton
def test_one_key_block_for_every_query_writes_dq_in_the_dkdv_kernel(monkeypatch) -> None:
    """Where one key block holds every key a query sees (few keys; top-left causal with few queries), each query
    block's dQ is one product, dS K: the dK/dV kernel writes it and the dQ kernel is not launched. dQ, dK and dV
    against float64 with GQA, a head dim in two chunks (72), causal and not, Nq > Nk and Nq < Nk; with 17 keys (two
    16-key blocks) the dQ kernel runs as before. Bitwise the same on a repeat."""
    from fuselab.ops.attention import triton_kernels as tk

    launched: list = []
    monkeypatch.setattr(tk, "attention_bwd_dq_kernel", _Recording(tk.attention_bwd_dq_kernel, launched))
    with tk.forced_plans({"dkdv": tk.Plan(16, 16, 1, 1), "dq": tk.Plan(16, 16, 1, 1)}):
        for shape, causal in [((1, 4, 2, 37, 9, 72), False), ((2, 2, 2, 45, 11, 24), True),
                              ((1, 3, 3, 12, 70, 24), True), ((1, 2, 1, 29, 16, 16), False)]:  # fmt: skip
            check_against_reference("triton", shape, causal, torch.float32, DEVICE)
        assert launched == []
        check_against_reference("triton", (1, 2, 1, 29, 17, 16), False, torch.float32, DEVICE)
        assert len(launched) == 1
        q, k, v = inputs((1, 4, 2, 37, 9, 72), torch.float32, DEVICE)
        grads = []
        for _ in range(2):
            xs = [t.clone().requires_grad_(True) for t in (q, k, v)]
            attention(*xs, causal=True, impl="triton").square().sum().backward()
            grads.append([x.grad for x in xs])
        assert all(torch.equal(a, b) for a, b in zip(*grads, strict=True))


def test_planned_as_the_h200_few_seen_keys_take_one_block_that_writes_dq(monkeypatch) -> None:
    """Planned as the H200 (tuning.planning_as; the launches are noted, not run): 12 causal queries over 9243 keys
    (d 96, a shape of the random draw where the backward took 2.2x cuDNN's time) are seen by 12 keys, so the dK/dV
    plan is fitted to those (one 16-key block, not 64 of the 9243) and that kernel writes dQ: no dQ kernel, its dQ
    tile of at most 32 fp32 values a thread (`dq_tile_rows`). 1000 x 1000 keeps its dQ kernel."""
    pytest.importorskip("triton")
    from fuselab.ops import tuning
    from fuselab.ops.attention import triton_kernels as tk

    launched: list = []
    monkeypatch.setattr(tk, "_launch", lambda kernel, grid, *a, plan, **c: launched.append((kernel, plan, c)))
    with tuning.planning_as(tuning.MODELS["sm_90"]):
        for nq, nk in ((12, 9243), (1000, 1000)):
            q = torch.randn(1, 2, nq, 96, dtype=torch.bfloat16)
            k, v = (torch.randn(1, 2, nk, 96, dtype=torch.bfloat16) for _ in range(2))
            o, lse = torch.empty_like(q), torch.zeros(1, 2, nq)
            launched.clear()
            tk.backward(torch.randn_like(q), q, k, v, o, lse, True, 96**-0.5)
            names = {getattr(kernel, "__name__", str(kernel)): (plan, c) for kernel, plan, c in launched}
            dkdv = next(name for name in names if "dkdv" in name)
            if nq == 12:
                plan, constexprs = names[dkdv]
                assert constexprs["WRITE_DQ"] and plan.block_n == 16 and not any("dq" in n for n in names), names
                assert plan.block_m <= tk.dq_tile_rows(96, plan.warps)
            else:
                assert any("_dq_" in n for n in names) and not names[dkdv][1].get("WRITE_DQ"), names


def test_the_recomputing_dq_kernel_writes_delta_before_the_dkdv_kernel_reads_it(monkeypatch) -> None:
    """Planned as the H200 (the launches noted, not run): where the dQ kernel recomputes S and dP on 16-bit tiles, it
    runs first and writes delta = rowsum(O * dO) (it loads dO anyway), so no delta kernel is launched; where the dK/dV
    kernel writes dQ (one key block) or stores dS for a dQ kernel of one product, and in fp32 (`delta_in_dq`), the
    delta kernel runs first, as before."""
    pytest.importorskip("triton")
    from fuselab.ops import tuning
    from fuselab.ops.attention import triton_kernels as tk

    launched: list = []
    monkeypatch.setattr(tk, "_launch", lambda kernel, grid, *a, plan, **c: launched.append(kernel.__name__))
    bf16, fp32 = torch.bfloat16, torch.float32
    want = {
        (1000, 1000, 96, bf16): ["attention_bwd_dq_tma_kernel", "attention_bwd_dkdv_tma_kernel"],
        (1000, 1000, 72, bf16): ["attention_bwd_dq_tma_kernel", "attention_bwd_dkdv_tma_kernel"],
        (12, 9243, 96, bf16): ["attention_bwd_delta_kernel", "attention_bwd_dkdv_kernel"],
        (300, 300, 128, bf16): [
            "attention_bwd_delta_kernel",
            "attention_bwd_dkdv_tma_kernel",
            "attention_bwd_dq_ds_kernel",
        ],
        (1000, 1000, 96, fp32): ["attention_bwd_delta_kernel", "attention_bwd_dkdv_kernel", "attention_bwd_dq_kernel"],
    }
    with tuning.planning_as(tuning.MODELS["sm_90"]):
        for (nq, nk, d, dtype), kernels in want.items():
            q = torch.randn(1, 4, nq, d, dtype=dtype)
            k, v = (torch.randn(1, 2, nk, d, dtype=dtype) for _ in range(2))
            o, lse = torch.randn_like(q), torch.zeros(1, 4, nq)
            launched.clear()
            tk.backward(torch.randn_like(q), q, k, v, o, lse, True, d**-0.5)
            order = [n for n in launched if any(part in n for part in ("delta", "dq", "dkdv"))]  # not sums, zeros
            assert order == kernels, (nq, nk, d, dtype, launched)


def test_the_delta_kernel_sums_as_the_dq_kernel_where_the_scores_are_stored(monkeypatch) -> None:
    """Planned as sm_90 (launches noted, not run): where dS is stored (TMA only), the delta kernel takes the rows and
    warps of the dQ kernel that writes delta on the pointer path, so both paths sum delta in one layout and give the
    same gradients; elsewhere 64 rows on 4 warps, or few queries' count rounded up to a power of 2 on 2 warps."""
    pytest.importorskip("triton")
    from fuselab.ops import tuning
    from fuselab.ops.attention import triton_kernels as tk

    launched: dict = {}
    monkeypatch.setattr(tk, "_launch", lambda kernel, grid, *a, plan, **c: launched.setdefault(kernel.__name__, plan))
    bf16, fp32 = torch.bfloat16, torch.float32
    with tuning.planning_as(tuning.MODELS["sm_90"]):
        dq = tk.choose_plan("dq", 128, bf16, True, torch.device("cpu"), 300, 300, 4)
        for (nq, nk, d, dtype), (rows, warps) in {
            (300, 300, 128, bf16): (dq.block_m, dq.warps),  # stored scores
            (12, 9243, 96, bf16): (16, 2),  # one key block, 12 queries
            (6661, 2, 128, bf16): (64, 4),
            (1000, 1000, 96, fp32): (64, 4),
        }.items():
            q = torch.randn(1, 4, nq, d, dtype=dtype)
            k, v = (torch.randn(1, 2, nk, d, dtype=dtype) for _ in range(2))
            launched.clear()
            tk.backward(torch.randn_like(q), q, k, v, torch.randn_like(q), torch.zeros(1, 4, nq), True, d**-0.5)
            plan = launched["attention_bwd_delta_kernel"]
            assert (plan.block_m, plan.warps) == (rows, warps), (nq, nk, d, dtype, plan)


@needs_triton
@pytest.mark.parametrize("d", [24, 72])
def test_delta_of_the_dq_kernel_reads_o_in_any_layout(d: int) -> None:
    """The dQ kernel that writes delta (forced on in fp32, which the interpreter runs) reads O by its strides: q, k,
    v sliced from (B, N, H, d) projections (so O is laid out in q's order, `output_like`), GQA 4 -> 2, 37 queries
    over 45 keys (no multiple of a block), causal and not, a head dim in one chunk (24) and in two (72 = 64 + 8 past
    64): dQ, dK and dV against float64, and bitwise the same on a repeat. (Not bitwise those of the delta kernel's
    path on a GPU: that kernel may run on other rows and warps, so its sum may take another layout.)"""
    from fuselab.ops.attention import triton_kernels as tk

    gen = torch.Generator(device="cpu").manual_seed(d)
    plans = {"dkdv": tk.Plan(16, 16, 1, 1), "dq": tk.Plan(16, 16, 1, 1)}
    with tk.forced_plans(plans), tk.forced_delta_in_dq(True):
        for causal in (False, True):
            q = torch.randn(2, 37, 4, d, generator=gen).to(DEVICE).transpose(1, 2)
            k, v = (torch.randn(2, 45, 2, d, generator=gen).to(DEVICE).transpose(1, 2) for _ in range(2))
            dout = torch.randn(2, 4, 37, d, generator=gen, dtype=torch.float64)
            xs = [t.clone().requires_grad_(True) for t in (q, k, v)]
            out = attention(*xs, causal=causal, impl="triton")
            assert out.stride() == xs[0].stride()  # O in q's layout, not contiguous
            out.backward(dout.to(DEVICE, torch.float32))
            xs64 = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
            reference(*xs64, causal=causal).backward(dout.to(DEVICE))
            err = gradient_error([x.grad for x in xs], [x.grad for x in xs64])
            assert err < ATTENTION.tolerance[torch.float32], (d, causal, err)
            again = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
            attention(*again, causal=causal, impl="triton").backward(dout.to(DEVICE, torch.float32))
            assert all(torch.equal(a.grad, b.grad) for a, b in zip(xs, again, strict=True)), (d, causal)


def test_the_tma_forward_of_two_chunks_takes_two_stages_at_128_keys(monkeypatch) -> None:
    """Planned as the H200 (the launches noted, not run), a TMA forward forced to 64 x 128 on 1 stage launches on 2
    where the head is two chunks (d 80 = 64 + 16, d 96 = 64 + 32: Triton 3.6 reads shared memory out of bounds there
    on 1 stage, session 53), and as forced at d 64 (one chunk) and at 64 keys a block."""
    pytest.importorskip("triton")
    from dataclasses import replace

    from fuselab.ops import tuning
    from fuselab.ops.attention import triton_kernels as tk

    launched: list = []
    monkeypatch.setattr(tk, "_launch", lambda kernel, grid, *a, plan, **c: launched.append((kernel.__name__, plan)))
    with tuning.planning_as(tuning.MODELS["sm_90"]):
        for d, forced, stages in ((80, tk.Plan(64, 128, 4, 1), 2), (96, tk.Plan(64, 128, 4, 1), 2),
                                  (64, tk.Plan(64, 128, 4, 1), 1), (80, tk.Plan(64, 64, 4, 1), 1)):  # fmt: skip
            q, k, v = (torch.randn(2, 3, 300, d, dtype=torch.bfloat16) for _ in range(3))
            launched.clear()
            with tk.forced_plans({"fwd": forced}):
                tk.forward(q, k, v, False, d**-0.5)
            assert launched == [("attention_fwd_tma_kernel", replace(forced, stages=stages))], (d, launched)


@needs_triton
def test_the_zeros_of_unseen_keys_are_written_by_a_kernel_and_seen_keys_are_left_alone() -> None:
    """attention_bwd_unseen_kernel writes the dK and dV zeros of the keys no query sees (a kernel, so that a call
    replayed from C, launches only, writes them too): on NaN-filled (2, 3, 70, 24) gradients with 12 keys seen,
    rows 12.. of every head become zeros, rows ..11 are left as they were."""
    import triton

    from fuselab.ops.attention import triton_kernels as tk

    z, h, nk, d, seen = 2, 3, 70, 24, 12
    dk, dv = (torch.full((z, h, nk, d), float("nan"), device=DEVICE) for _ in range(2))
    rows, block = z * h * (nk - seen), 16
    tk._launch(
        tk.attention_bwd_unseen_kernel, (triton.cdiv(rows, block),), dk, dv, rows, nk, seen,
        plan=tk.Plan(block, block, 1, 1), HEAD_DIM=d, D_PAD=tk.d_pad(d), BLOCK_R=block,
    )  # fmt: skip
    for g in (dk, dv):
        assert g[:, :, seen:].count_nonzero() == 0 and g[:, :, :seen].isnan().all()


class _Recording:
    """A kernel that notes each launch in `launched`, then launches."""

    def __init__(self, kernel: object, launched: list) -> None:
        self.kernel, self.launched = kernel, launched

    def __getitem__(self, grid: object) -> object:
        self.launched.append(grid)
        return self.kernel[grid]


@triton.jit
def _program_of_each(out, NUM, H, ORDER_HEADS, LONGEST_FIRST: tl.constexpr, ACROSS_HEADS: tl.constexpr):
    """Each program writes what `_program` makes it: (bh, z, h, block) at out[program_id]."""
    bh, z, h, block = _program(NUM, H, ORDER_HEADS, LONGEST_FIRST, ACROSS_HEADS)
    row = out + tl.program_id(0) * 4
    tl.store(row, bh)
    tl.store(row + 1, z)
    tl.store(row + 2, h)
    tl.store(row + 3, block)


@pytest.mark.skipif(not TRITON_OK, reason="Triton needs a GPU or TRITON_INTERPRET=1")
@pytest.mark.parametrize("longest_first", [False, True])
@pytest.mark.parametrize(
    ("across_heads", "order_heads"), [(False, 4), (True, 1), (True, 2), (True, 4), (True, 9), (True, 64)]
)
def test_programs_cover_every_block_once_and_causal_blocks_go_longest_first_across_heads(
    longest_first: bool, across_heads: bool, order_heads: int
) -> None:
    """`_program` over 3 batches x 3 heads x 5 blocks: each (head, block) once. Across heads, the programs run in
    groups of `order_heads` heads, the last taking the heads left over (2 + 2 + 2 + 3, 4 + 5), one group after
    another, block by block within each (every head's block before any head's next), from the last block where
    LONGEST_FIRST (a causal query block's work grows with its index, a key block's falls); head by head otherwise."""
    z, h, num = 3, 3, 5
    device = "cuda" if HAS_CUDA else "cpu"
    out = torch.full((z * h * num, 4), -1, dtype=torch.int32, device=device)
    _program_of_each[(z * h * num,)](out, num, h, order_heads, longest_first, across_heads)
    got = [tuple(row) for row in out.cpu().tolist()]
    assert sorted((bh, block) for bh, _, _, block in got) == [(bh, b) for bh in range(z * h) for b in range(num)]
    assert all(bh == zz * h + hh for bh, zz, hh, _ in got)
    blocks = list(range(num))[:: -1 if longest_first else 1]
    count = max(z * h // order_heads, 1)
    groups = [range(g * order_heads, (g + 1) * order_heads if g < count - 1 else z * h) for g in range(count)]
    if across_heads:
        expected = [(bh, b) for g in groups for b in blocks for bh in g]
    else:
        expected = [(bh, b) for bh in range(z * h) for b in blocks]
    assert [(bh, block) for bh, _, _, block in got] == expected


def test_the_causal_kernels_order_heads_in_groups_that_share_their_reads_and_outlast_their_longest_block() -> None:
    """On the H200's 132 SMs, groups of 132 // ORDER_SHARE heads where heads are long (4 096 tokens in 64 rows a block:
    64 blocks); more where they are short, so that a group's work outlasts its longest program: at 1 100 tokens (18
    blocks, 171 block steps a head) 28 heads hold 4 788 steps, 18 a program on each of 2 x 132 slots. Without a GPU (0
    SMs), head by head; a small one, at least 1."""
    from fuselab.ops import tuning
    from fuselab.ops.attention import triton_kernels as tk

    sms = tuning.MODELS["sm_90"].sms
    assert tk.order_heads(sms, 64) == 132 // tk.ORDER_SHARE == 16
    assert tk.order_heads(sms, 18) == 28
    heads = tk.order_heads(sms, 18)
    assert heads * 18 * 19 / 2 / (2 * sms) >= 18 > (heads - 1) * 18 * 19 / 2 / (2 * sms)
    assert tk.order_heads(0, 64) == 1
    assert tk.order_heads(tk.ORDER_SHARE - 1, 1 << 20) == 1


@pytest.mark.skipif(not TRITON_OK, reason="Triton needs a GPU or TRITON_INTERPRET=1")
def test_head_dim_chunks_pad_less_than_one_power_of_two() -> None:
    """Head dims of today's models past 64 in two power-of-two chunks where that multiplies fewer zeros than one; up
    to 64 in one (a 16-column chunk cost more than the pad at d 48)."""
    from fuselab.ops.attention.triton_kernels import d_chunks

    expected = {16: (16, 0), 24: (32, 0), 40: (64, 0), 48: (64, 0), 64: (64, 0), 72: (64, 16), 80: (64, 16),
                96: (64, 32), 112: (128, 0), 128: (128, 0), 160: (128, 32), 192: (128, 64), 256: (256, 0),
                1: (16, 0)}  # fmt: skip
    assert {d: d_chunks(d) for d in expected} == expected
    for d in range(1, 257):
        first, second = d_chunks(d)
        assert first + second >= d and first + second <= max(16, 1 << (d - 1).bit_length())
        assert all(c == 0 or (c >= 16 and c & (c - 1) == 0) for c in (first, second))


@pytest.mark.skipif(not TRITON_OK, reason="Triton needs a GPU or TRITON_INTERPRET=1")
def test_tma_kernels_hold_wide_heads_in_two_chunks_of_128() -> None:
    """The TMA forward takes d_chunks' chunks up to 192 columns; heads of 193-256 (one chunk of 256 in the pointer
    kernels) as 128 + 128, the same columns worked; past 256 a chunk stays too wide for TMA."""
    from fuselab.ops.attention.triton_kernels import d_chunks, tma_chunks

    for d in range(1, 193):
        assert tma_chunks(d) == d_chunks(d)
    for d in (193, 200, 224, 255, 256):
        assert tma_chunks(d) == (128, 128) and sum(d_chunks(d)) == 256
    assert max(tma_chunks(264)) > 128 and max(tma_chunks(512)) > 128


@pytest.mark.skipif(not TRITON_OK, reason="Triton needs a GPU or TRITON_INTERPRET=1")
def test_plans_fit_short_sequences_and_keep_long_ones() -> None:
    """No tile is longer than its sequence padded (>= 16), warps shrink with the tile, long sequences keep the plan."""
    from fuselab.ops.attention.triton_kernels import Plan, fit_plan

    fwd, dkdv = Plan(128, 64, 8, 3), Plan(64, 128, 8, 3)
    assert fit_plan("fwd", fwd, 3000, 3000, 80, 132, 128) == fwd  # many programs: as tuned
    assert fit_plan("fwd", fwd, 3, 3, 30000, 132, 128) == Plan(16, 16, 1, 3)  # N = 3: 16 x 16, one warp
    assert fit_plan("dq", fwd, 3, 3, 30000, 132, 512).warps == 4  # 512-byte rows keep 4 warps' registers
    assert fit_plan("dkdv", dkdv, 20, 20, 30000, 132, 192) == Plan(32, 32, 2, 3)
    assert fit_plan("fwd", fwd, 12, 9243, 30000, 132, 128) == Plan(16, 64, 1, 3)  # few queries, many keys
    assert fit_plan("dkdv", dkdv, 9243, 12, 30000, 132, 128) == Plan(64, 16, 1, 3)
    # few programs: the block along the grid is halved to fill the SMs (as before), the warps kept
    assert fit_plan("fwd", fwd, 1000, 1000, 8, 132, 128) == Plan(32, 32, 8, 3)
    assert fit_plan("dkdv", dkdv, 1000, 1000, 8, 132, 128) == Plan(32, 32, 8, 3)
    for n in range(1, 300, 7):
        for kernel, plan in (("fwd", fwd), ("dq", fwd), ("dkdv", dkdv)):
            fitted = fit_plan(kernel, plan, n, n + 5, 1 + n % 50, 132, 256)
            assert 16 <= fitted.block_m <= max(16, 1 << (n - 1).bit_length())
            assert fitted.warps >= 1 and fitted.warps & (fitted.warps - 1) == 0


@needs_triton
def test_triton_function_saves_exactly_q_k_v_o_and_logsumexp() -> None:
    from fuselab.ops.attention import FlashAttentionTriton

    q, k, v = (t.requires_grad_(True) for t in inputs((2, 19, 16), torch.float32, DEVICE))
    out = FlashAttentionTriton.apply(q, k, v, True)
    saved = out.grad_fn.saved_tensors
    assert len(saved) == 5
    assert all(a is b for a, b in zip(saved[:3], (q, k, v), strict=True))
    assert saved[3].shape == (2, 19, 16) and saved[4].shape == (2, 19) and saved[4].dtype == torch.float32
    ref_lse = FlashAttentionTiled.apply(q, k, v, True).grad_fn.saved_tensors[4]
    torch.testing.assert_close(saved[4], ref_lse, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out, reference(q, k, v, causal=True).float(), rtol=1e-4, atol=1e-5)


@needs_triton
def test_triton_strided_inputs_and_stride0_grad() -> None:
    """q, k, v as transposed views of (B, N, H, d) tensors; the gradient of o.sum() has stride 0 everywhere."""
    base = [torch.randn(1, n, 2, 24, device=DEVICE) for n in (21, 30, 30)]
    xs = [t.transpose(1, 2).requires_grad_(True) for t in (b.clone() for b in base)]
    xs = [t.detach().requires_grad_(True) for t in xs]
    assert not xs[0].is_contiguous()
    attention(*xs, causal=True, impl="triton").sum().backward()
    xs64 = [t.detach().double().requires_grad_(True) for t in xs]
    reference(*xs64, causal=True).sum().backward()
    for a, b in zip(xs, xs64, strict=True):
        assert relative_error(a.grad, b.grad) < ATTENTION.tolerance[torch.float32]


@needs_triton
def test_triton_lays_o_out_in_qs_order_as_its_fake_does() -> None:
    """O takes q's order of dimensions, as SDPA's kernels do: for q, k, v sliced from one (B, N, 3, H, d) projection,
    o.transpose(1, 2) is contiguous (a model's reshape to (B, N, H * d) is a view, not a copy), O and the gradients
    right. The op's fake, which torch.compile plans the graph with, gives the real output's strides for such q, for
    contiguous q and for q of 3 and 5 dims (contiguous O)."""
    from fuselab.ops.attention import triton as impl

    b, n, h, d = 2, 37, 3, 24
    qkv = torch.randn(b, n, 3, h, d, device=DEVICE)
    xs = [t.detach().requires_grad_(True) for t in qkv.permute(2, 0, 3, 1, 4)]  # (B, H, N, d) views, not contiguous
    o = attention(*xs, causal=True, impl="triton")
    assert not xs[0].is_contiguous() and o.transpose(1, 2).is_contiguous()
    dy = torch.randn_like(o)
    o.backward(dy)
    xs64 = [t.detach().double().requires_grad_(True) for t in xs]
    want = reference(*xs64, causal=True)
    want.backward(dy.double())
    tolerance = ATTENTION.tolerance[torch.float32]
    assert relative_error(o, want) < tolerance
    for x, x64 in zip(xs, xs64, strict=True):
        assert relative_error(x.grad, x64.grad) < tolerance
    for q in (xs[0].detach(), torch.randn(b, h, n, d, device=DEVICE), torch.randn(b, n, d, device=DEVICE),
              torch.randn(2, b, h, n, d, device=DEVICE)):  # fmt: skip
        real, fake = impl.forward(q, q, q, False, None)[0], impl._fake(q, q, q, False, None)[0]
        assert real.shape == fake.shape == q.shape and real.stride() == fake.stride(), q.stride()


@needs_triton
def test_triton_backward_is_deterministic() -> None:
    q, k, v = inputs((1, 4, 2, 40, 37, 16), torch.float32, DEVICE)
    grads = []
    for _ in range(2):
        xs = [t.clone().requires_grad_(True) for t in (q, k, v)]
        attention(*xs, causal=True, impl="triton").backward(torch.ones(q.shape, device=DEVICE) * 0.5)
        grads.append([x.grad for x in xs])
    for a, b in zip(*grads, strict=True):
        assert torch.equal(a, b)


def test_functional_takes_torch_signature_and_refuses_what_it_cannot_do() -> None:
    """fuselab.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal, scale,
    enable_gqa) as torch's: the same result as F.scaled_dot_product_attention by position and keyword; a mask or
    dropout is a ValueError naming torch's function; heads that differ need enable_gqa, as in torch."""
    import torch.nn.functional as F

    from fuselab.ops.attention import scaled_dot_product_attention as sdpa

    q, k, v = inputs((2, 4, 9, 16), torch.float32, "cpu")
    want = F.scaled_dot_product_attention(q, k, v, None, 0.0, True, scale=0.3)
    torch.testing.assert_close(sdpa(q, k, v, None, 0.0, True, scale=0.3, impl="naive"), want)
    torch.testing.assert_close(sdpa(q, k, v, is_causal=True, scale=0.3, impl="naive"), want)
    with pytest.raises(ValueError, match=r"no attn_mask.*torch\.nn\.functional\.scaled_dot_product_attention"):
        sdpa(q, k, v, torch.ones(9, 9, dtype=torch.bool))  # a positional mask, as torch's callers pass it
    with pytest.raises(ValueError, match="no dropout"):
        sdpa(q, k, v, dropout_p=0.1)
    kv = [t[:, :2] for t in (k, v)]
    with pytest.raises(ValueError, match="enable_gqa=True"):
        sdpa(q, *kv, impl="naive")
    torch.testing.assert_close(
        sdpa(q, *kv, enable_gqa=True, impl="naive"), F.scaled_dot_product_attention(q, *kv, enable_gqa=True)
    )


@needs_triton
def test_triton_compiles_fullgraph_without_break() -> None:
    from fuselab.ops.attention import scaled_dot_product_attention

    q, k, v = (t.requires_grad_(True) for t in inputs((1, 2, 20, 16), torch.float32, DEVICE))

    def model(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return scaled_dot_product_attention(q * 2, k, v, is_causal=True, impl="triton").square().sum()

    backend = "inductor" if HAS_CUDA else "aot_eager"
    torch.compile(model, fullgraph=True, backend=backend)(q, k, v).backward()
    compiled = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    model(q, k, v).backward()
    for a, t in zip(compiled, (q, k, v), strict=True):
        torch.testing.assert_close(a, t.grad, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------------- GPU

TOL_16 = {torch.float16: 3e-3, torch.bfloat16: 2.4e-2}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("d", [16, 32, 64, 80, 96, 128, 192, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_triton_head_dims_and_dtypes(d: int, dtype: torch.dtype, causal: bool) -> None:
    for shape in [(2, 3, 1, 1, d), (1, 4, 2, 300, 257, d), (2, 2, 1000, d)]:
        check_against_reference("triton", shape, causal, dtype, "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 17, 128, 129, 1000, 2048, 4097])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_triton_lengths(n: int, causal: bool) -> None:
    check_against_reference("triton", (1, 2, n, max(1, n // 3 + 5), 64), causal, torch.bfloat16, "cuda")
    check_against_reference("triton", (1, 2, n, 64), causal, torch.bfloat16, "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_triton_short_sequences_with_fitted_tiles(dtype: torch.dtype, causal: bool) -> None:
    """Many heads of a few queries (16 x 16 tiles of 1-4 warps), few queries over many keys, and the reverse."""
    for shape in [(37, 8, 4, 3, 3, 96), (5, 4, 1, 20, 20, 256), (3, 2, 2, 40, 9, 48), (2, 2, 1, 12, 300, 80),
                  (2, 3, 3, 300, 12, 128), (64, 2, 2, 2, 2, 192)]:  # fmt: skip
        check_against_reference("triton", shape, causal, dtype, "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_triton_n1_and_nq1_gradients(dtype: torch.dtype, causal: bool) -> None:
    one_key_per_query_gradients("triton", (3, 2, 1, 1, 64), causal, dtype, "cuda")  # N = 1
    if causal:  # one query, 77 keys: it sees key 0 alone
        one_key_per_query_gradients("triton", (3, 2, 1, 77, 64), causal, dtype, "cuda")
    check_against_reference("triton", (3, 2, 1, 77, 64), causal, dtype, "cuda")  # Nq = 1 < Nk
    check_against_reference("triton", (2, 4, 2, 1, 300, 80), causal, dtype, "cuda")  # and GQA, d 80


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_gpu_triton_replayed_backward_leaves_no_unseen_key_unwritten(dtype: torch.dtype) -> None:
    """Top-left causal, 5 queries over 77 keys: keys 5.. are seen by none, their dK and dV exact zeros. A call of
    the same key again is replayed from C (launches only): when torch zeroed those rows, the replay skipped them and
    the gate of 2026-12-03 found them NaN on the second call; a kernel writes them now. The memory each call's
    gradients take is poisoned with NaN first, and every call must give the first one's gradients."""
    shape = (3, 2, 5, 77, 64)
    q, k, v = inputs(shape, dtype, "cuda")
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(5)).to("cuda", dtype)
    grads = []
    for _ in range(3):
        xs = [t.clone().requires_grad_(True) for t in (q, k, v)]
        out = attention(*xs, causal=True, impl="triton")
        poison_allocator(4 * k.numel() * k.element_size(), "cuda")
        out.backward(dout)
        dk, dv = xs[1].grad, xs[2].grad
        assert not dk[:, :, 5:].any() and not dv[:, :, 5:].any(), non_finite(xs)
        grads.append([x.grad for x in xs])
    for again in grads[1:]:
        for a, b in zip(grads[0], again, strict=True):
            assert torch.equal(a, b)
    check_against_reference("triton", shape, True, dtype, "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_gpu_few_keys_split_the_query_loop_deterministically(dtype: torch.dtype) -> None:
    """Three keys over 3000 queries: the dK/dV grid has 2 programs, so each key block's query loop is split over
    programs (query_splits) whose partials are summed in a fixed order: right against float64, and bitwise the same
    on every repeat."""
    from fuselab.ops.attention import triton_kernels as tk

    shape = (1, 8, 2, 3000, 3, 80)
    assert tk.query_splits(2, 3000, 64, torch.cuda.get_device_properties(0).multi_processor_count) > 1
    for causal in (False, True):
        check_against_reference("triton", shape, causal, dtype, "cuda")
    q, k, v = inputs(shape, dtype, "cuda")
    grads = []
    for _ in range(2):
        xs = [t.clone().requires_grad_(True) for t in (q, k, v)]
        attention(*xs, causal=False, impl="triton").square().sum().backward()
        grads.append([x.grad for x in xs])
    for a, b in zip(*grads, strict=True):
        assert torch.equal(a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_gpu_stored_scores_are_right_and_deterministic(dtype: torch.dtype) -> None:
    """The backward with dS stored by the dK/dV kernel for a dQ kernel of one product (forced, whatever the rule):
    right against float64 at ragged lengths, Nq != Nk both ways, GQA, head dims in one and two chunks, and of 193-256
    (the pointer dK/dV kernel storing dS), causal and not; bitwise the same on repeat; the same gradients as the dQ
    kernel that recomputes dS, to 16-bit rounding."""
    from fuselab.ops.attention import triton_kernels as tk

    shapes = [(2, 8, 2, 1000, 1000, 80), (1, 4, 4, 333, 517, 64), (3, 2, 1, 129, 77, 48), (1, 4, 2, 700, 700, 128),
              (1, 4, 2, 333, 290, 256), (2, 2, 1, 150, 411, 200)]  # fmt: skip
    with tk.forced_stored_scores(True):
        for shape in shapes:
            for causal in (False, True):
                check_against_reference("triton", shape, causal, dtype, "cuda")
    q, k, v = inputs((2, 8, 2, 1000, 1000, 96), dtype, "cuda")
    assert tk.tma_ready(q, k, v)
    grads = []
    for stored in (True, True, False):
        xs = [t.clone().requires_grad_(True) for t in (q, k, v)]
        with tk.forced_stored_scores(stored):
            attention(*xs, causal=True, impl="triton").square().sum().backward()
        grads.append([x.grad for x in xs])
    for a, b, c in zip(*grads, strict=True):
        assert torch.equal(a, b)
        torch.testing.assert_close(a, c, rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
def test_gpu_scores_past_the_budget_are_stored_a_slice_of_heads_at_a_time(monkeypatch) -> None:
    """With the scores' budget cut to two KV heads' scores, the backward runs slice by slice (`score_slices`: batches,
    or KV-head groups of one batch), TMA throughout, each slice storing its dS: right against float64 at GQA, ragged
    lengths, Nq != Nk, heads of 136, 160 and 256; bitwise the same on repeat. Causal runs whole, and is right."""
    from fuselab.ops.attention import triton_kernels as tk

    ran = []
    by_slices = tk._backward_by_slices
    monkeypatch.setattr(tk, "_backward_by_slices", lambda slices, *a: ran.append(len(slices)) or by_slices(slices, *a))
    for z, hq, hkv, nq, nk, d in [(2, 6, 2, 700, 530, 160), (1, 8, 8, 333, 333, 256), (3, 4, 4, 257, 600, 136)]:
        monkeypatch.setattr(tk, "SCORES_MAX_BYTES", 2 * hq // hkv * nq * nk * 2)
        for causal in (False, True):
            ran.clear()
            check_against_reference("triton", (z, hq, hkv, nq, nk, d), causal, torch.bfloat16, "cuda")
            slices = tk.score_slices(d, z, hq, hkv, nq, nk, causal)
            assert (slices is None) == causal  # causal runs whole
            assert ran == ([len(slices)] if slices else []), ran  # sliced, views ready for TMA
    q, k, v = inputs((2, 6, 2, 700, 530, 160), torch.bfloat16, "cuda")
    monkeypatch.setattr(tk, "SCORES_MAX_BYTES", 2 * 3 * 700 * 530 * 2)
    grads = []
    for _ in range(2):
        xs = [t.clone().requires_grad_(True) for t in (q, k, v)]
        attention(*xs, causal=False, impl="triton").square().sum().backward()
        grads.append([x.grad for x in xs])
    for a, b in zip(*grads, strict=True):
        assert torch.equal(a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_gpu_triton_deterministic(dtype: torch.dtype) -> None:
    q, k, v = inputs((2, 8, 2, 1500, 1500, 64), dtype, "cuda")
    grads = []
    for _ in range(2):
        xs = [t.clone().requires_grad_(True) for t in (q, k, v)]
        attention(*xs, causal=True, impl="triton").sum().backward()
        grads.append([x.grad for x in xs])
    for a, b in zip(*grads, strict=True):
        assert torch.equal(a, b)


def test_query_splits_fill_the_sms_only_when_the_key_grid_cannot() -> None:
    pytest.importorskip("triton")
    from fuselab.ops.attention import triton_kernels as tk

    assert tk.query_splits(programs=132, nq=15004, block_m=64, sms=132) == 1  # a full grid: one program a key block
    assert tk.query_splits(programs=8, nq=15004, block_m=64, sms=132) == 17  # 1 x 32 x 8 x 15004 x 3: 136 programs
    assert tk.query_splits(programs=8, nq=300, block_m=64, sms=132) == 2  # shares of at least two query blocks
    assert tk.query_splits(programs=8, nq=100, block_m=64, sms=132) == 1
    assert tk.query_splits(programs=8, nq=100, block_m=64, sms=0) == 1  # off the GPU


def test_descriptors_are_tritons_own_made_without_its_checks() -> None:
    """The launchers' TMA descriptors skip TensorDescriptor's checks (tma_ready made them; 2 us of host time each) and
    are still Triton's class exactly (the C launcher takes no other), equal to the checked constructor's, two for a
    head dim of two chunks."""
    pytest.importorskip("triton")
    from triton.tools.tensor_descriptor import TensorDescriptor

    from fuselab.ops.attention import triton_kernels as tk

    assert tk._UNCHECKED  # this Triton's fields: the unchecked path is the one run
    t = torch.empty(3, 2, 87, 80, dtype=torch.bfloat16)
    first, second = tk._descriptors(t, 64, *tk.d_chunks(80))
    assert type(first) is TensorDescriptor and type(second) is TensorDescriptor
    assert first == TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, 64, 64])
    assert second == TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, 64, 16])
    assert tk._descriptors(t[..., :64], 32, 64, 0)[1] is None


@needs_triton
@pytest.mark.parametrize("tma", [False, True], ids=["pointers", "tma"])
def test_the_dkdv_query_splits_match_one_program_per_key_block(tma: bool, monkeypatch) -> None:
    """Few keys leave the dK/dV grid nearly empty, so each key block's query loop is split over programs whose fp32
    partials are summed in a fixed order: the gradients of the unsplit kernel (to fp32 rounding), bitwise the same on
    every repeat, at one to five keys, GQA, causal and not, ragged shares and a head dim in two chunks (72)."""
    from fuselab.ops.attention import triton_kernels as tk

    monkeypatch.setattr(tk, "tma_ready", lambda *ts: tma)
    one_program = tk.query_splits
    for z, hq, hkv, nq, nk, d, causal in [(1, 4, 2, 75, 3, 16, True), (2, 2, 1, 61, 1, 72, False),
                                          (1, 2, 2, 50, 37, 16, False), (1, 3, 1, 40, 5, 16, True)]:  # fmt: skip
        gen = torch.Generator(device="cpu").manual_seed(nq + nk + d)
        q, do = (torch.randn(z, hq, nq, d, generator=gen).to(DEVICE) for _ in range(2))
        k, v = (torch.randn(z, hkv, nk, d, generator=gen).to(DEVICE) for _ in range(2))
        o, lse = tk.forward(q, k, v, causal, d**-0.5)
        one = tk.backward(do, q, k, v, o, lse, causal, d**-0.5)
        monkeypatch.setattr(tk, "query_splits", lambda programs, nq, block_m, sms: 3)
        split = tk.backward(do, q, k, v, o, lse, causal, d**-0.5)
        again = tk.backward(do, q, k, v, o, lse, causal, d**-0.5)
        monkeypatch.setattr(tk, "query_splits", one_program)
        for a, b, c in zip(one, split, again, strict=True):
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
            assert torch.equal(b, c)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_gpu_tma_kernels_match_the_pointer_kernels(dtype: torch.dtype, monkeypatch) -> None:
    """On Hopper the kernels read 16-bit tensors by TMA descriptors; they give the pointer kernels' O, L, dQ, dK and
    dV bitwise (the same tiles, the same order of operations) at ragged lengths, Nq != Nk, GQA, chunked head dims, a
    transposed layout and a strided output gradient; inputs TMA cannot address (fp32, a 2-byte-misaligned base,
    d 264) take the pointer kernels."""
    from fuselab.ops.attention import triton_kernels as tk

    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("TMA needs Hopper or later")
    cases = [((2, 4, 2, 77, 77, 64), True), ((1, 3, 1000, 80), True), ((2, 2, 1, 300, 517, 96), False),
             ((1, 2, 129, 128), False), ((3, 2, 1, 1, 48), True), ((1, 4, 4, 250, 250, 72), True),
             ((1, 2, 2, 700, 333, 112), True)]  # fmt: skip
    for shape, causal in cases:
        q, k, v = (t.to(dtype) for t in inputs(shape, torch.float32, "cuda"))
        do = torch.randn((*q.shape[:-1], q.shape[-1] + 8), device="cuda", dtype=dtype)[..., 3 : 3 + q.shape[-1]]
        assert tk.tma_ready(q, k, v) and not tk.tma_ready(do)  # dO: a 6-byte offset, copied for the TMA kernels
        results = []
        for tma in (True, False):
            if not tma:
                monkeypatch.setattr(tk, "tma_ready", lambda *ts: False)
            o, lse = tk.forward(q, k, v, causal, 0.3)
            results.append((o, lse, *tk.backward(do, q, k, v, o, lse, causal, 0.3)))
        monkeypatch.undo()
        for name, a, b in zip(("O", "L", "dQ", "dK", "dV"), *results, strict=True):
            assert torch.equal(a, b), (shape, name)
    q = torch.randn(2, 300, 4, 64, device="cuda", dtype=dtype).transpose(1, 2)  # (B, H, N, d) of a (B, N, H, d)
    assert tk.tma_ready(q, q, q)
    x = torch.randn(2, 4, 100, 65, device="cuda", dtype=dtype)
    assert not tk.tma_ready(x[..., 1:])  # rows of 65 elements: strides not 16-byte multiples
    assert not tk.tma_ready(q.float()) and not tk.tma_ready(torch.randn(1, 2, 8, 264, device="cuda", dtype=dtype))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_gpu_wide_heads_go_by_tma_and_are_right(dtype: torch.dtype) -> None:
    """Heads of 193-256 columns: the forward by TMA in two chunks of 128 (`tma_chunks`), the backward by pointers in
    one of 256; O and every gradient against float64 at ragged lengths, Nq != Nk, GQA, causal and not."""
    from fuselab.ops.attention import triton_kernels as tk

    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("TMA needs Hopper or later")
    for d in (200, 256):
        assert tk.tma_ready(torch.randn(1, 2, 8, d, device="cuda", dtype=dtype))
        for shape, causal in [
            ((2, 4, 2, 333, 290, d), True),
            ((1, 2, 2, 150, 411, d), False),
            ((3, 2, 1, 70, 70, d), True),
        ]:
            check_against_reference("triton", shape, causal, dtype, "cuda")


@pytest.mark.gpu
def test_gpu_triton_memory_grows_linearly() -> None:
    """Extra memory at N = 32768 (naive would need 2 * 32768^2 * 2 bytes = 4 GiB of scores per head) stays O(N)."""
    peaks = {}
    for n in (8192, 32768):
        q, k, v = (t.requires_grad_(True) for t in inputs((1, 2, n, 64), torch.bfloat16, "cuda"))
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated()
        attention(q, k, v, causal=True, impl="triton").sum().backward()
        torch.cuda.synchronize()
        peaks[n] = torch.cuda.max_memory_allocated() - start
    assert peaks[32768] < 6 * peaks[8192]  # 4x the length: ~4x the memory, not 16x
    assert peaks[32768] < 64 * 2**20


@pytest.mark.gpu
def test_gpu_sdpa_parity_nan_and_inf() -> None:
    """NaN in a key and inf in a query poison the rows SDPA's do; every other row matches SDPA."""
    q, k, v = inputs((1, 2, 200, 64), torch.bfloat16, "cuda")
    k[0, 0, 150, 3] = float("nan")
    q[0, 1, 20, 0] = float("inf")
    for causal in (False, True):
        ours = attention(q, k, v, causal=causal, impl="triton")
        theirs = attention(q, k, v, causal=causal, impl="sdpa-flash")
        assert torch.equal(torch.isnan(ours), torch.isnan(theirs))
        finite = torch.isfinite(theirs)
        assert torch.equal(finite, torch.isfinite(ours))
        assert relative_error(ours[finite], theirs[finite]) < TOL_16[torch.bfloat16]


TTIR_SCRIPT = r"""
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.compiler.compiler import make_backend
from triton._C.libtriton import ir
from fuselab.ops.attention import triton_kernels as tk

POINTERS = {"Q", "K", "V", "O", "DO", "DK", "DV", "DQ"}
FP32_POINTERS = {"LSE", "DELTA", "DKP", "DVP"}
CONSTANTS = {"HEAD_DIM": 80, "D_PAD": 128, "DA": 64, "DB": 16, "BLOCK_M": 64, "BLOCK_N": 64, "CAUSAL": True,
             "QSPLIT": True, "PREC": "tf32", "WIDTH": 80, "BLOCK_R": 64, "WRITE_DQ": True, "STORE_DS": True,
             "WRITE_DELTA": True, "ALIGN": 8}
# d 80 in two chunks (64 + 16); dK/dV into partials, and their sum; dK/dV writing dQ; dK/dV storing dS; dQ writing
# delta
target = GPUTarget("cuda", 90, 32)
backend = make_backend(target)
options = backend.parse_options({"num_warps": 4, "num_stages": 2})
for kernel in tk.TRITON_KERNELS:
    signature, constants = {}, {}
    for i, p in enumerate(kernel.params):
        if p.is_constexpr:
            signature[p.name] = "constexpr"
            constants[(i,)] = CONSTANTS[p.name]
        elif p.name in POINTERS or p.name in FP32_POINTERS:
            signature[p.name] = "*fp32" if p.name in FP32_POINTERS else "*bf16"
        elif p.name == "ds_desc":  # the stored scores' descriptor: 64 keys x 64 queries
            signature[p.name] = "tensordesc<bf16[1,64,64]>"
        elif p.name[-3:] in ("_da", "_db"):  # the TMA kernels' descriptors: chunk a (64 columns) or b (16)
            signature[p.name] = f"tensordesc<bf16[1,1,64,{64 if p.name.endswith('_da') else 16}]>"
        else:  # a Python float reaches the kernel as fp64 under torch.compile (Inductor's signature), an int as i32
            signature[p.name] = "fp64" if p.name.endswith("scale") else "i32"
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    ASTSource(kernel, signature, constants, {}).make_ir(
        target, options, backend.get_codegen_implementation(options), backend.get_module_map(), context
    )
    print("ok", kernel.__name__)
"""


def test_tma_is_for_hopper_tensors_only() -> None:
    """Off a CUDA GPU (CPU tensors, the interpreter) the forward never takes the TMA kernel."""
    pytest.importorskip("triton")
    from fuselab.ops.attention import triton_kernels as tk

    t = torch.randn(1, 2, 16, 64, dtype=torch.bfloat16)
    assert not tk.tma_ready(t, t, t)


def test_triton_kernels_compile_with_the_scalars_torch_compile_passes() -> None:
    """torch.compile (Inductor) types a Python float argument fp64, where Triton's own launch types it fp32; the
    kernels once let it turn their accumulators fp64 and failed to compile there (tl.dot's accumulator assertion)
    while eager mode worked. Compiled to Triton IR for an sm_90 target here, no GPU needed."""
    import subprocess
    import sys

    from fuselab.ops.attention import triton_kernels as tk

    env = {**os.environ, "TRITON_INTERPRET": "0"}
    done = subprocess.run([sys.executable, "-c", TTIR_SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("ok ") == len(tk.TRITON_KERNELS) == 10, done.stdout


@pytest.mark.slow
def test_fp32_kernels_compile_for_sm_90_keeping_their_tiles_in_registers() -> None:
    """fp32 products are "ieee", unrolled into FMAs by ptxas: past d 64 the rule's tiles hold at most 16 x 32 x 128
    of them a product, and the kernels planned as the H200 plans them compile for sm_90 (no GPU) with at most 128
    bytes spilled a thread. The tiles before (64 x 32 forward, 32 x 64 dK/dV at d 128) spilled 33-101 KB a thread at
    2 x 16 x 4 x 4096 x 4096 x 128 causal and took 78 s to compile here, not 16."""
    import subprocess
    import sys
    from pathlib import Path

    from fuselab.ops import tuning
    from fuselab.ops.attention import triton_kernels as tk

    with tuning.planning_as(tuning.GPUModel("nvidia-h200-sm90", 132, 9)):  # the GPU's rules, not the interpreter's
        for d in (80, 96, 128, 192, 256):
            for kernel in ("fwd", "dkdv", "dq"):
                plan = tk.rule_plan(kernel, d, torch.float32, True)
                assert plan.block_m * plan.block_n * tk.d_work(d) / (32 * plan.warps) <= 512, (d, kernel, plan)
    script = Path(__file__).resolve().parents[2] / "scripts" / "attention_offline_audit.py"
    shapes = ["2x16x4x4096x4096x128c", "1x4x1x1024x1024x256c"]
    done = subprocess.run([sys.executable, str(script), "--dtype", "fp32", *shapes],
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line.split() for line in done.stdout.splitlines() if line.split()[:1] and line.split()[0] in shapes]
    products = [r for r in rows if r[1] in {f"attention_{k}_kernel" for k in ("fwd", "bwd_dkdv", "bwd_dq")}]
    assert len(products) == 6, done.stdout
    for shape, kernel, tile, warps, _, spilled, *_ in products:
        if spilled != "None":  # None: no ptxas found
            assert int(spilled) <= 128, f"{shape} {kernel} {tile} on {warps} warps: {spilled} bytes spilled a thread"


def test_narrow_16_bit_heads_take_128_keys_a_dkdv_tile() -> None:
    """16-bit heads of up to 32 columns (64-byte rows, no plan-table key) take dK/dV tiles of 32 queries x 128 keys
    by rule; wider ones keep 32 x 64 (on an H100 the 128-key tile took 0.87-0.95x the forward + backward time at d 24
    and 32, 7 of 8 settings). Fitted to a shape, few keys still cut the tile."""
    from fuselab.ops import tuning
    from fuselab.ops.attention import triton_kernels as tk

    with tuning.planning_as(tuning.GPUModel("nvidia-h100-80gb-hbm3-sm90", 132, 9)):
        for dtype in (torch.bfloat16, torch.float16):
            for d in (8, 16, 24, 32):
                assert tk.rule_plan("dkdv", d, dtype, True) == tk.Plan(32, 128, 4, 3), d
            for d in (33, 48, 64, 80):
                assert tk.rule_plan("dkdv", d, dtype, False) == tk.Plan(32, 64, 4, 3), d
        assert tk.rule_plan("dkdv", 32, torch.float32, True) != tk.Plan(32, 128, 4, 3)  # fp32 keeps its own
        long = tk.choose_plan("dkdv", 32, torch.bfloat16, True, torch.device("cuda"), 5000, 5000, 36)
        few_keys = tk.choose_plan("dkdv", 32, torch.bfloat16, True, torch.device("cuda"), 40, 40, 200)
    assert long == tk.Plan(32, 128, 4, 3)
    # 40 keys: the tile cut to the sequence padded, its warps with it (its stages are another rule's)
    assert (few_keys.block_m, few_keys.block_n, few_keys.warps) == (32, 64, 2)


def test_16_bit_rows_past_d_128_keep_their_own_plans() -> None:
    """fp32's register-bound tiles past d 64 are fp32's alone: 16-bit heads of 192 and 256 keep the tiles sized to
    shared memory (the fp32 rule once caught them too, and the H200's bf16 causal forward at d 192-256 took 1.1-1.5x
    its time on the seed-11 draw's small shapes)."""
    from fuselab.ops import tuning
    from fuselab.ops.attention import triton_kernels as tk

    with tuning.planning_as(tuning.GPUModel("nvidia-h200-sm90", 132, 9)):
        for dtype in (torch.bfloat16, torch.float16):
            assert tk.rule_plan("fwd", 192, dtype, True) == tk.Plan(64, 32, 4, 2)
            assert tk.rule_plan("dkdv", 160, dtype, False) == tk.Plan(32, 64, 4, 1)
            assert tk.rule_plan("dkdv", 192, dtype, True) == tk.Plan(32, 64, 4, 1)
            assert tk.rule_plan("dkdv", 256, dtype, True) == tk.Plan(32, 32, 4, 2)  # 64 keys' accumulators spill
            assert tk.rule_plan("dkdv", 200, dtype, False) == tk.Plan(32, 32, 4, 2)  # worked as 256 columns
            assert tk.rule_plan("dq", 256, dtype, True) == tk.Plan(64, 32, 4, 1)
            assert tk.rule_plan("fwd", 384, dtype, True) == tk.Plan(32, 32, 4, 1)
            assert tk.rule_plan("dq", 384, dtype, True) == tk.Plan(32, 16, 4, 1)
        assert tk.rule_plan("fwd", 192, torch.float32, True) == tk.Plan(16, 16, 4, 1)
        assert tk.rule_plan("fwd", 96, torch.float32, True) == tk.Plan(16, 32, 4, 1)


def test_dkdv_programs_of_short_query_loops_take_2_stages() -> None:
    """On a GPU's plans, a 16-bit dK/dV plan of 3 stages drops to 2 where its programs visit at most 12 query blocks
    on average (nq / block_m, half that causal): the GPT block's 1024 tokens causal, not 2048 nor 1024 unmasked;
    fp32 and forced plans keep theirs."""
    from fuselab.ops import tuning
    from fuselab.ops.attention import triton_kernels as tk

    def dkdv(nq: int, causal: bool, dtype: torch.dtype = torch.bfloat16, d: int = 64) -> tk.Plan:
        return tk.choose_plan("dkdv", d, dtype, causal, torch.device("cuda"), nq, nq, 96)

    with tuning.planning_as(tuning.GPUModel("nvidia-h100-80gb-hbm3-sm90", 132, 9)):
        assert dkdv(1024, True) == tk.Plan(64, 64, 4, 2)  # 8 blocks on average
        assert dkdv(1536, True) == tk.Plan(64, 64, 4, 2)  # 12
        assert dkdv(2048, True) == tk.Plan(64, 64, 4, 3)  # 16
        assert dkdv(16384, True) == tk.Plan(64, 64, 4, 3)
        assert dkdv(1024, False).stages == 3  # 16 blocks unmasked
        assert dkdv(700, False, d=80).stages == 2
        assert dkdv(1024, True, torch.float32, d=32).stages == 3  # fp32's plans are its own (64 x 128 x 8 x 3)
        assert tk.choose_plan("dq", 64, torch.bfloat16, True, torch.device("cuda"), 1024, 1024, 96).stages == 3
        with tk.forced_plans({"dkdv": tk.Plan(64, 64, 4, 3)}):
            assert dkdv(1024, True).stages == 3
    assert tk.short_loop_stages(tk.Plan(32, 64, 4, 1), 100, True).stages == 1  # never more stages


def test_heads_of_33_to_40_columns_take_the_padded_heads_forward() -> None:
    """On a GPU's plans, the 16-bit forward of heads of 33-40 columns at long sequences takes 128 x 64 on 3 stages
    (fitted to the shape) in place of the d-64 key's tiles; 41-64 columns, short sequences, the backward's kernels,
    fp32 and forced plans keep theirs."""
    from fuselab.ops import tuning
    from fuselab.ops.attention import triton_kernels as tk

    def plan(kernel: str, d: int, nq: int, nk: int, dtype: torch.dtype = torch.bfloat16, causal: bool = True):
        return tk.choose_plan(kernel, d, dtype, causal, torch.device("cuda"), nq, nk, 48)

    with tuning.planning_as(tuning.GPUModel("nvidia-h200-sm90", 132, 9)):
        d64 = plan("fwd", 64, 2500, 2500)
        assert d64 == tk.Plan(64, 128, 4, 2)  # the table's
        for d in (33, 36, 40):
            assert plan("fwd", d, 2500, 2500) == tk.Plan(128, 64, 4, 3)
            assert plan("fwd", d, 4096, 4096, torch.float16, causal=False) == tk.Plan(128, 64, 4, 3)
            assert plan("fwd", d, 4096, 77) == tk.Plan(128, 64, 4, 3)  # long by its queries; 64 keys fit 77
        assert plan("fwd", 40, 3000, 40) == tk.Plan(128, 64, 4, 3)
        for d in (41, 48, 56):
            assert plan("fwd", d, 2500, 2500) == d64
        assert plan("fwd", 40, 700, 700) == plan("fwd", 64, 700, 700)  # short: the table's short plan
        assert plan("dkdv", 40, 2500, 2500) == plan("dkdv", 64, 2500, 2500)
        assert plan("dq", 40, 2500, 2500) == plan("dq", 64, 2500, 2500)
        assert plan("fwd", 40, 2500, 2500, torch.float32) == plan("fwd", 64, 2500, 2500, torch.float32)
        assert plan("fwd", 24, 2500, 2500) == plan("fwd", 32, 2500, 2500)  # d_work 32: not padded to 64
        with tk.forced_plans({"fwd": tk.Plan(64, 128, 4, 2)}):
            assert plan("fwd", 40, 2500, 2500) == tk.Plan(64, 128, 4, 2)


@needs_triton
@pytest.mark.parametrize("causal", [False, True])
def test_the_tma_kernels_match_the_pointer_kernels(causal: bool, monkeypatch) -> None:
    """The TMA kernels (forward, dK/dV, dQ), forced here under the interpreter (fp32, 16 x 16 tiles; the interpreter
    runs tensor descriptors), give the pointer kernels' O, L, dQ, dK and dV: at ragged lengths, Nq != Nk, GQA and a
    head dim in two chunks (72 = 64 + 16; 200, which the pointer kernels hold as one chunk of 256 and the TMA forward
    as 128 + 128, its backward by pointers on both sides). To the last bit of fp32 only: numpy multiplies a tile
    loaded transposed and a tile transposed after loading in different orders. On the GPU they agree bitwise
    (test_gpu_tma_kernels_match_the_pointer_kernels)."""
    from fuselab.ops.attention import triton_kernels as tk

    for z, hq, hkv, nq, nk, d in [(1, 2, 2, 37, 37, 16), (1, 4, 2, 21, 45, 72), (1, 2, 1, 19, 23, 200)]:
        gen = torch.Generator(device="cpu").manual_seed(nq + d)
        q, do = (torch.randn(z, hq, nq, d, generator=gen).to(DEVICE) for _ in range(2))
        k, v = (torch.randn(z, hkv, nk, d, generator=gen).to(DEVICE) for _ in range(2))
        results = []
        for tma in (True, False):
            monkeypatch.setattr(tk, "tma_ready", lambda *ts, tma=tma: tma)
            o, lse = tk.forward(q, k, v, causal, d**-0.5)
            results.append((o, lse, *tk.backward(do, q, k, v, o, lse, causal, d**-0.5)))
        for a, b in zip(*results, strict=True):
            torch.testing.assert_close(a, b, rtol=2e-6, atol=2e-6)


@needs_triton
def test_the_backward_by_slices_of_heads_gives_the_whole_backwards_gradients(monkeypatch) -> None:
    """Scores past the budget: the backward run a slice of heads at a time (interpreter, TMA forced, the budget cut
    to a few heads' scores) gives the gradients of the whole backward storing every head's scores, bitwise (each
    head's work is the same), at GQA with slices of batches and of KV heads, ragged lengths; only the slices'
    backwards store, each within the budget. Unmasked: causal runs whole (`score_slices`)."""
    from fuselab.ops.attention import triton_kernels as tk

    monkeypatch.setattr(tk, "tma_ready", lambda *ts: True)
    stored, rule = [], tk.stores_scores
    monkeypatch.setattr(tk, "stores_scores", lambda d, heads, nq, nk: stored.append(heads) or rule(d, heads, nq, nk))
    for z, hq, hkv, nq, nk, d, fit in [(3, 4, 2, 37, 29, 136, 2), (1, 6, 3, 45, 21, 160, 2)]:
        gen = torch.Generator(device="cpu").manual_seed(nq + nk + d)
        q, do = (torch.randn(z, hq, nq, d, generator=gen).to(DEVICE) for _ in range(2))
        k, v = (torch.randn(z, hkv, nk, d, generator=gen).to(DEVICE) for _ in range(2))
        o, lse = tk.forward(q, k, v, False, d**-0.5)
        with tk.forced_stored_scores(True):
            whole = tk.backward(do, q, k, v, o, lse, False, d**-0.5)
        per_head = hq // hkv * nq * nk * 2  # bytes of a KV head's scores
        monkeypatch.setattr(tk, "SCORES_MAX_BYTES", fit * per_head)
        stored.clear()
        sliced = tk.backward(do, q, k, v, o, lse, False, d**-0.5)
        slices = -(-z // (fit // hkv)) if fit >= hkv else z * -(-hkv // fit)  # batches, or KV-head groups of one
        assert len(stored) == slices and all(heads * nq * nk * 2 <= fit * per_head for heads in stored)
        assert all(rule(d, heads, nq, nk) for heads in stored)  # each slice stores its scores
        for a, b in zip(whole, sliced, strict=True):
            assert torch.equal(a, b)


@needs_triton
@pytest.mark.parametrize("causal", [False, True])
def test_dq_from_stored_scores_matches_dq_recomputed(causal: bool, monkeypatch) -> None:
    """The backward with dS stored by the dK/dV kernel and read by a dQ kernel of one product gives the gradients of
    the one that recomputes S and dP for dQ (to fp32 rounding; interpreter, TMA forced, 16 x 16 tiles): at ragged
    lengths, Nq != Nk both ways, GQA, a head dim in two chunks (72), split query loops, and d 200 (the pointer dK/dV
    kernel storing dS, the dQ kernel reading K in two chunks of 128); bitwise the same on repeat."""
    from fuselab.ops.attention import triton_kernels as tk

    monkeypatch.setattr(tk, "tma_ready", lambda *ts: True)
    pointer_dkdv, dq_ds = [], []
    monkeypatch.setattr(tk, "attention_bwd_dkdv_kernel", _Recording(tk.attention_bwd_dkdv_kernel, pointer_dkdv))
    monkeypatch.setattr(tk, "attention_bwd_dq_ds_kernel", _Recording(tk.attention_bwd_dq_ds_kernel, dq_ds))
    shapes = [(1, 2, 2, 37, 37, 16), (2, 4, 2, 21, 45, 72), (1, 2, 1, 53, 19, 16), (1, 2, 1, 29, 23, 200)]
    for z, hq, hkv, nq, nk, d in shapes:
        gen = torch.Generator(device="cpu").manual_seed(nq + nk + d)
        q, do = (torch.randn(z, hq, nq, d, generator=gen).to(DEVICE) for _ in range(2))
        k, v = (torch.randn(z, hkv, nk, d, generator=gen).to(DEVICE) for _ in range(2))
        o, lse = tk.forward(q, k, v, causal, d**-0.5)
        with tk.forced_stored_scores(False):
            recomputed = tk.backward(do, q, k, v, o, lse, causal, d**-0.5)
        with tk.forced_stored_scores(True):
            stored = tk.backward(do, q, k, v, o, lse, causal, d**-0.5)
            again = tk.backward(do, q, k, v, o, lse, causal, d**-0.5)
        for a, b, c in zip(recomputed, stored, again, strict=True):
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
            assert torch.equal(b, c)
    assert len(pointer_dkdv) == 3 and len(dq_ds) == 2 * len(shapes)  # d 200's three backward passes by pointers
    with tk.forced_stored_scores(True):  # a few keys: the dK/dV query loop split over programs, each storing its dS
        monkeypatch.setattr(tk, "query_splits", lambda programs, nq, block_m, sms: 3)
        q, do = (torch.randn(1, 2, 70, 16, generator=gen).to(DEVICE) for _ in range(2))
        k, v = (torch.randn(1, 1, 40, 16, generator=gen).to(DEVICE) for _ in range(2))
        o, lse = tk.forward(q, k, v, causal, 0.25)
        qs, ks, vs = (t.clone().double().requires_grad_(True) for t in (q, k, v))
        reference(qs, ks, vs, causal=causal).backward(do.double())
        for got, want in zip(tk.backward(do, q, k, v, o, lse, causal, 0.25), (qs.grad, ks.grad, vs.grad), strict=True):
            torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-5)


def test_scores_are_stored_for_dq_at_wide_heads_within_a_budget() -> None:
    """dS is stored for dQ where the tiles hold 128 columns or more (the recomputed products cost more than the
    stored scores' traffic there) and it takes at most SCORES_MAX_BYTES; recomputed otherwise; forced either way."""
    pytest.importorskip("triton")
    from fuselab.ops.attention import triton_kernels as tk

    assert tk.stores_scores(128, 32, 2048, 2048) and tk.stores_scores(112, 16, 1200, 1200)
    assert tk.stores_scores(160, 32, 800, 800) and tk.stores_scores(192, 24, 1000, 1000)
    assert not tk.stores_scores(64, 96, 1024, 1024) and not tk.stores_scores(96, 12, 500, 500)
    assert not tk.stores_scores(80, 8, 300, 300)
    assert not tk.stores_scores(128, 32, 3000, 3000)  # 576 MB of scores: recomputed, memory O(N)
    assert tk.SCORES_MAX_BYTES <= 256 * 2**20
    with tk.forced_stored_scores(True):
        assert tk.stores_scores(64, 96, 1024, 1024)
    with tk.forced_stored_scores(False):
        assert not tk.stores_scores(128, 32, 2048, 2048)
    assert tk.stores_scores(128, 32, 2048, 2048)


def test_scores_past_the_budget_are_stored_a_slice_of_heads_at_a_time() -> None:
    """Where dS would be stored but all heads' scores pass SCORES_MAX_BYTES, the backward runs over (batch, KV head)
    slices whose scores each fit: whole batches where a batch's heads fit, else KV-head groups of one batch, as even
    as the budget allows; every head once, in order. Within the budget, heads of at most 128 columns of work, one
    KV head's scores past it, or causal: whole (None)."""
    pytest.importorskip("triton")
    from fuselab.ops.attention import triton_kernels as tk

    budget = tk.SCORES_MAX_BYTES
    unmasked = functools.partial(tk.score_slices, causal=False)
    assert unmasked(160, 2, 10, 10, 3000, 3000) == [(slice(0, 1), slice(0, 10)), (slice(1, 2), slice(0, 10))]
    assert unmasked(192, 2, 12, 4, 2500, 2500) == [(slice(0, 1), slice(0, 4)), (slice(1, 2), slice(0, 4))]
    assert unmasked(256, 1, 16, 16, 4096, 4096) == [(slice(0, 1), slice(0, 8)), (slice(0, 1), slice(8, 16))]
    assert unmasked(144, 1, 16, 16, 2991, 2991) == [(slice(0, 1), slice(0, 8)), (slice(0, 1), slice(8, 16))]
    assert unmasked(128, 1, 16, 16, 2991, 2991) is None  # tiles of 128 columns: whole, dQ recomputing
    assert unmasked(112, 1, 32, 8, 3000, 3000) is None
    assert unmasked(136, 4, 8, 8, 2048, 2048) is None  # 256 MiB: within the budget
    assert unmasked(96, 4, 32, 32, 4096, 4096) is None  # tiles under 128 columns: recomputed
    assert unmasked(160, 1, 4, 1, 6000, 6000) is None  # one KV head's 4 query heads: 275 MiB
    assert tk.score_slices(192, 2, 12, 4, 2500, 2500, True) is None  # causal: whole
    gen = random.Random(29)
    for _ in range(300):
        hkv = gen.randint(1, 12)
        z, hq, n, d = gen.randint(1, 6), hkv * gen.choice((1, 2, 3, 4, 8)), gen.randint(500, 9000), gen.randint(97, 256)
        slices = unmasked(d, z, hq, hkv, n, n + 7)
        per_head = hq // hkv * n * (n + 7) * 2
        if slices is None:
            assert z * hkv * per_head <= budget or per_head > budget or tk.d_work(d) <= 128
            continue
        covered = [(b, h) for zs, hs in slices for b in range(zs.start, zs.stop) for h in range(hs.start, hs.stop)]
        assert covered == [(b, h) for b in range(z) for h in range(hkv)]  # every head once, in order
        sizes = [(zs.stop - zs.start) * (hs.stop - hs.start) for zs, hs in slices]
        assert all(size * per_head <= budget for size in sizes) and max(sizes) - min(sizes) <= max(sizes) // 2 + 1
        fit = budget // per_head  # the fewest slices: whole batches where a batch fits, else KV-head groups
        assert len(slices) == (-(-z // (fit // hkv)) if fit >= hkv else z * -(-hkv // fit))


@pytest.mark.parametrize("device_key", ["nvidia-h100-80gb-hbm3-sm90", "nvidia-h200-sm90"])
def test_the_tuner_tries_small_two_stage_forwards_and_hoppers_run_them_at_short_sequences(device_key: str) -> None:
    """The forward's candidates include 64 x 64 and 64 x 32 on 2 stages, and the H100's and the H200's tables hold
    what their tuners chose of them for short sequences, each key kept where it was not slower at held-out shapes of
    91-999 tokens (H100: 0.76-0.94x the long class's forward at 8 causal shapes; H200: 0.75-0.96x at 11 shapes, both
    masks); long sequences keep the long class's plans."""
    from fuselab.ops import tuning
    from fuselab.ops.attention import triton_kernels as tk
    from fuselab.ops.attention.tune import candidates

    assert {tk.Plan(64, 64, 4, 2), tk.Plan(64, 32, 4, 2)} <= set(candidates("fwd", 96, torch.bfloat16))
    table = tuning.load_table(tk.FOLDER, device_key)
    for d, causal, plan in ((64, True, tk.Plan(64, 64, 4, 2)), (80, True, tk.Plan(64, 64, 4, 2)),
                            (96, True, tk.Plan(64, 64, 4, 2)), (128, True, tk.Plan(64, 32, 4, 2)),
                            (80, False, tk.Plan(64, 64, 4, 2))):  # fmt: skip
        assert tk.table_plan("fwd", d, torch.bfloat16, causal, table, tk.n_class(127, 127)) == plan, (d, causal)
        assert tk.table_plan("fwd", d, torch.bfloat16, causal, table, tk.n_class(4096, 4096)) != plan, (d, causal)


def test_the_tuner_tries_fewer_keys_for_wide_16_bit_heads() -> None:
    """Past d 128 the tuner's dK/dV candidates include the smaller key blocks the sweep found faster at d 256 (64
    keys' fp32 accumulators spill there), and every candidate fits the wide rows' shared memory (at most 64 x 64)."""
    from fuselab.ops import tuning
    from fuselab.ops.attention import triton_kernels as tk
    from fuselab.ops.attention.tune import candidates

    with tuning.planning_as(tuning.GPUModel("nvidia-h200-sm90", 132, 9)):
        plans = candidates("dkdv", 256, torch.bfloat16)
        assert plans[0] == tk.rule_plan("dkdv", 256, torch.bfloat16, False)
        assert {tk.Plan(32, 64, 4, 1), tk.Plan(32, 32, 4, 2), tk.Plan(32, 16, 4, 2)} <= set(plans)
        assert len(plans) == len(set(plans))
        assert all(p.block_m * p.block_n <= 64 * 64 for p in plans)
