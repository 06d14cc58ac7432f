"""Softmax: what is particular to it: odd, empty and scalar shapes, every Triton kernel path, non-contiguous input,
-inf / all -inf / huge / NaN rows, gradients, widths and row counts. What every op must do (dtype, device and
bad-input errors, opcheck of the custom ops, fullgraph compile, fake tensors, the nn module as a drop-in, every impl x
dtype x check shape on a GPU) is tests/ops/test_contract.py's.

On the CPU: naive, torch, compile and triton (under Triton's interpreter, fp32, small sizes) run, each Triton kernel
is also compiled for sm_90 (no GPU needed) to check it builds with 16-byte accesses and no spills; cuda reports itself
unavailable. GPU tests (`pytest -m gpu`) cover every impl x fp32/fp16/bf16 x kernel path, gradients, > 65535 rows,
rows of 2^20, and (marked slow) offsets past 2^31 elements.
"""

from __future__ import annotations

import ctypes
import itertools
import json
import math
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest
import torch

import fuselab  # (TRITON_INTERPRET=1 without a GPU, before any kernel is defined)
from fuselab.bench.accuracy import gradient_error, poison_allocator
from fuselab.bench.accuracy import relative_error as rel_err
from fuselab.ops import get_op, tuning
from fuselab.ops.softmax import SOFTMAX, Softmax, cuda, launch, plans
from fuselab.ops.softmax import triton as st
from fuselab.ops.softmax._shared import as_rows
from fuselab.ops.softmax.plans import next_power_of_2
from fuselab.ops.softmax.spec import reference

DTYPES = SOFTMAX.dtypes  # fp32, fp16, bf16
EAGER_IMPLS = ("naive", "torch", "triton", "cuda")  # GPU tests; the compiled impl has its own (compiling costs)
FUSED = ("triton", "cuda")  # the impls with their own backward kernels
# The interpreter computes in numpy, which warns on -inf - -inf (= NaN, what an all -inf row must give).
interpreter_quiet = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def run(name: str, x: torch.Tensor) -> torch.Tensor:
    """impl `name` on x; the compiled impl is compiled afresh (static shapes), as the harness does per case."""
    impl = SOFTMAX.get_impl(name)
    if impl.compiled:
        torch._dynamo.reset()
        return torch.compile(impl.fn, dynamic=False)(x)
    return impl(x)


def check_against_reference(name: str, shape: tuple[int, ...], dtype: torch.dtype, device: str) -> None:
    (x,) = SOFTMAX.make_inputs(shape, dtype, device, 0)
    poison_allocator(x.numel() * x.element_size(), device)  # unwritten output elements would show as NaN
    out = run(name, x)
    assert out.shape == x.shape and out.dtype == dtype and out.device == x.device
    err = rel_err(out, reference(x))
    assert err <= SOFTMAX.tolerance[dtype], f"{name} {dtype} {shape}: rel err {err:.2e}"


def reference_grad(y_of: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """d(sum(dy * softmax(x)))/dx in float64."""
    x64 = y_of.detach().double().requires_grad_()
    (grad,) = torch.autograd.grad(reference(x64), x64, dy.double())
    return grad


def special_rows(dtype: torch.dtype, device: str, width: int = 300) -> torch.Tensor:
    """Rows of `width` random values, each but the first with something special in it."""
    (x,) = SOFTMAX.make_inputs((10, width), torch.float32, device, 1)
    big = torch.finfo(dtype).max / 4
    inf, nan = float("inf"), float("nan")
    x[1, ::7] = -inf  # some -inf entries: they get 0
    x[2] = -inf  # all -inf: NaN, as torch.softmax
    x[3, ::5], x[3, 1::5] = big, -big  # huge values: the max is subtracted first, no overflow
    x[4, width // 2] = inf  # +inf: NaN
    x[5, width - 1] = nan  # NaN: NaN
    x[6] = -inf
    x[6, width - 1] = 3.0  # one finite entry among -inf: exactly 1 there
    x[7] = -big  # all equal: uniform
    x[8, width - 1] = big  # one huge entry at the very end
    x[9] -= 100.0  # a max below -88.7 (exp(-max) overflows fp32) ...
    x[9, : width // 2] = -inf  # ... and a first half of -inf: where a row is cut into spans, spans of only -inf
    return x.to(dtype)


def assert_softmax_like_torch(out: torch.Tensor, x: torch.Tensor, what: str) -> None:
    """Same NaN rows as torch.softmax in float64 and the same values elsewhere (within the dtype's tolerance)."""
    expected = torch.softmax(x.double(), dim=-1)
    assert torch.equal(torch.isnan(out), torch.isnan(expected)), f"{what}: NaN at other places than torch.softmax"
    assert rel_err(out, expected) <= SOFTMAX.tolerance[x.dtype], f"{what}: rel err {rel_err(out, expected):.2e}"


# ---------------------------------------------------------------------------------------------- the spec


def test_registered_impls() -> None:
    assert get_op("softmax") is SOFTMAX
    # triton-elementwise: forward only, see test_softmax_elementwise.py
    assert list(SOFTMAX.impls) == ["naive", "torch", "compile", "triton", "cuda", "triton-elementwise", "liger"]
    assert SOFTMAX.defaults.rivals == ("liger",) and SOFTMAX.impls["liger"].upstream
    assert [n for n, i in SOFTMAX.impls.items() if i.compiled] == ["compile"]
    assert all(SOFTMAX.impls[n].backward for n in FUSED)
    assert SOFTMAX.options == {} and SOFTMAX.defaults.baseline == "torch"


def test_inputs_are_spread() -> None:
    """Seeded, random and nonzero inputs are the contract test's; the spread is softmax's."""
    (x,) = SOFTMAX.make_inputs((3, 37, 129), torch.float32, "cpu", 7)
    assert x.std() > 3  # rows far from uniform


def test_cost_model_and_shapes() -> None:
    assert SOFTMAX.bytes_moved((2**19, 128), torch.float32) == 2 * 4 * 2**26  # 256 MiB read, 256 MiB written
    assert SOFTMAX.bytes_moved((3, 5), torch.bfloat16) == 2 * 2 * 15
    assert SOFTMAX.flops((4, 5)) == 5 * 20
    assert [s[1] for s in SOFTMAX.defaults.bench_shapes] == [2**k for k in range(7, 19)]
    assert all(rows * width == 2**26 for rows, width in SOFTMAX.defaults.bench_shapes)
    widths = {s[-1] if s else 1 for s in SOFTMAX.defaults.check_shapes}
    assert {0, 1, 3, 129, 5000, 40000} <= widths  # empty, one, short, odd, one row per program, looped
    assert any(len(s) > 1 and s[0] > 65535 for s in SOFTMAX.defaults.check_shapes)


def test_reference_is_torch_softmax_in_float64() -> None:
    (x,) = SOFTMAX.make_inputs((7, 1001), torch.float32, "cpu", 3)
    ref = reference(x)
    assert ref.dtype == torch.float64
    assert rel_err(ref, torch.softmax(x.double(), -1)) == 0
    assert torch.allclose(ref.sum(-1), torch.ones(7, dtype=torch.float64))


def test_torch_softmax_on_empty_and_scalar() -> None:
    """What the impls must match: empty shapes stay empty; a scalar is a row of one element."""
    assert torch.softmax(torch.empty(5, 0), -1).shape == (5, 0)
    assert torch.softmax(torch.empty(0, 7), -1).shape == (0, 7)
    assert torch.softmax(torch.tensor(3.0), -1).item() == 1.0


# ---------------------------------------------------------------------------------------------- CPU runs


@interpreter_quiet
@pytest.mark.parametrize("shape", SOFTMAX.defaults.check_shapes, ids=str)
@pytest.mark.parametrize("name", ["naive", "torch", "triton"])
def test_cpu_fp32_matches_reference(name: str, shape: tuple[int, ...]) -> None:
    check_against_reference(name, shape, torch.float32, "cpu")


@pytest.mark.parametrize("shape", [(37, 129), (0, 7), (4, 5, 300)], ids=str)
def test_cpu_compile_matches_reference(shape: tuple[int, ...]) -> None:
    check_against_reference("compile", shape, torch.float32, "cpu")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", ["naive", "torch", "triton"])
def test_cpu_half_precision(name: str, dtype: torch.dtype) -> None:
    check_against_reference(name, (37, 129), dtype, "cpu")


@interpreter_quiet
@pytest.mark.parametrize("name", ["naive", "torch", "compile", "triton"])
def test_cpu_non_contiguous(name: str) -> None:
    """Transposed (copied), sliced columns and rows (read in place through the row stride), a 3-d view whose leading
    dimensions do not merge (copied), and broadcast rows (stride 0)."""
    (x,) = SOFTMAX.make_inputs((37, 129), torch.float32, "cpu", 2)
    (x3,) = SOFTMAX.make_inputs((4, 9, 70), torch.float32, "cpu", 3)
    views = (x.t(), x[:, 5:-7], x[::3], x[1:, ::2], x3[:, 2:7, :], x3.permute(1, 0, 2), x[:1].expand(5, 129))
    for view in views:
        assert not view.is_contiguous()
        out = run(name, view)
        assert out.shape == view.shape
        assert rel_err(out, reference(view)) <= SOFTMAX.tolerance[torch.float32], f"{name} {view.stride()}"


def test_as_rows_copies_only_when_needed() -> None:
    x = torch.randn(6, 10)
    assert as_rows(x[:, 2:7]).data_ptr() == x[:, 2:7].data_ptr()  # sliced columns: a view
    assert as_rows(x[::2]).stride() == (20, 1)
    assert as_rows(x[:1].expand(4, 10)).stride() == (0, 1)
    assert as_rows(x.t()).is_contiguous()  # a strided last dimension: copied
    assert as_rows(torch.tensor(2.0)).shape == (1, 1)
    x3 = torch.randn(2, 3, 4)
    assert as_rows(x3[:, :2]).shape == (4, 4) and as_rows(x3[:, :2]).is_contiguous()


@interpreter_quiet
@pytest.mark.parametrize("name", ["naive", "compile", "triton"])
def test_cpu_special_rows_as_torch_softmax(name: str) -> None:
    """Rows with -inf, all -inf, huge values, +inf, NaN: as torch.softmax (torch's own fp32 CPU kernel differs on
    some, so the torch impl is checked on the GPU only)."""
    for width in (1, 3, 300):  # rows kernel, several rows per program; one entry; odd width
        x = special_rows(torch.float32, "cpu", width)
        assert_softmax_like_torch(run(name, x), x, f"{name} width {width}")


# ---------------------------------------------------------------------------------------------- Triton paths

# Every kernel forced at small sizes (the interpreter is slow), so each path runs on the CPU: the automatic choice
# would give these widths the rows kernel. The persistent rows-ahead kernel runs st.INTERPRETER_PROGRAMS programs
# here, so each takes several tiles, the last ones past the end of the rows. The split kernel can only run one chunk
# per row here (the interpreter runs programs one after another, so a program cannot wait for another); the GPU
# tests run it with many.
FORWARD_PLANS = {
    "rows, 8 per program": lambda w: st.Plan("rows", next_power_of_2(w), rows=8),
    "rows, 1 per program": lambda w: st.Plan("rows", next_power_of_2(w), rows=1),
    "rows ahead, 2 per program": lambda w: st.Plan("rows_ahead", next_power_of_2(w), rows=2),
    "looped, 64 columns a step": lambda w: st.Plan("looped", 64),
    "split, 1 chunk": lambda w: st.Plan("split", next_power_of_2(w)),
}
BACKWARD_PLANS = {k: v for k, v in FORWARD_PLANS.items() if not k.startswith(("split", "rows ahead"))}
PATH_WIDTHS = (1, 3, 64, 65, 300)


@interpreter_quiet
@pytest.mark.parametrize("plan", FORWARD_PLANS, ids=str)
def test_cpu_triton_forward_paths(plan: str) -> None:
    """Into a NaN-poisoned output, rows read through a row stride (a slice of wider rows): every element written."""
    for width in PATH_WIDTHS:
        (wide,) = SOFTMAX.make_inputs((13, width + 5), torch.float32, "cpu", width)
        x = wide[:, 2 : 2 + width]
        y = torch.full((13, width), float("nan"))
        st.launch_forward(x, y, FORWARD_PLANS[plan](width))
        assert rel_err(y, reference(x)) <= SOFTMAX.tolerance[torch.float32], f"{plan}, width {width}"
        specials = special_rows(torch.float32, "cpu", width)
        y = torch.full(specials.shape, float("nan"))
        st.launch_forward(specials, y, FORWARD_PLANS[plan](width))
        assert_softmax_like_torch(y, specials, f"{plan}, width {width}")


@interpreter_quiet
@pytest.mark.parametrize("plan", BACKWARD_PLANS, ids=str)
def test_cpu_triton_backward_paths(plan: str) -> None:
    for width in PATH_WIDTHS:
        (x,) = SOFTMAX.make_inputs((13, width), torch.float32, "cpu", width)
        (dy,) = SOFTMAX.make_inputs((13, width + 3), torch.float32, "cpu", width + 1)
        dy = dy[:, 3:]
        y = torch.softmax(x, -1)
        dx = torch.full_like(x, float("nan"))
        st.launch_backward(y, dy, dx, BACKWARD_PLANS[plan](width))
        assert rel_err(dx, reference_grad(x, dy)) <= SOFTMAX.tolerance[torch.float32], f"{plan}, width {width}"


@interpreter_quiet
def test_cpu_triton_single_column_rows_run_elementwise() -> None:
    """Rows of one column take the `single` plan both ways (a block of rows a program, elementwise), unless the rule
    is off. Into NaN-poisoned outputs, with a masked last program (rows no multiple of the block) and through row
    strides (a column of wider rows): y is 1 where x is finite and NaN where not, dx = y (dy - y dy), as torch."""
    cpu = torch.device("cpu")
    assert st.backward_plan(1, torch.bfloat16, cpu) == st.Plan("single", 2048, rows=1, num_warps=4)
    off = {**launch.params(cpu), "single_column": [0, 4]}
    assert plans.choose_forward(1, 4, False, 132, off).kernel == "rows"
    assert plans.choose_backward(1, 2, off).kernel == "rows"
    rows = 2 * 1024 + 37
    (wide,) = SOFTMAX.make_inputs((rows, 5), torch.float32, "cpu", 1)
    wide[5, 2], wide[700, 2], wide[rows - 1, 2], wide[9, 2] = float("inf"), float("-inf"), float("nan"), 3e38
    (dy,) = SOFTMAX.make_inputs((rows, 3), torch.float32, "cpu", 2)
    for x, g in ((wide[:, 2:3], dy[:, 1:2]), (wide[:, 2:3].contiguous(), dy[:, 1:2].contiguous())):
        assert st.forward_plan(1, x.dtype, cpu).kernel == "single"
        y = torch.full((rows, 1), float("nan"))
        st.launch_forward(x, y)
        assert_softmax_like_torch(y, x, f"one column, row stride {x.stride(0)}")
        dx = torch.full((rows, 1), float("nan"))
        st.launch_backward(y, g, dx)
        expected = reference_grad(x, g)
        assert torch.equal(torch.isnan(dx), torch.isnan(expected)), f"row stride {x.stride(0)}: NaN elsewhere"
        assert rel_err(dx, expected) <= SOFTMAX.tolerance[torch.float32], f"row stride {x.stride(0)}"


@interpreter_quiet
def test_cpu_triton_backward_split_rows() -> None:
    """Few wide rows (fewer than 2 per "SM": the interpreter counts 3): each row split over programs, partial sums of
    y * dy added in a fixed order (bitwise the same dx twice), every element of a NaN-poisoned dx written; with tiny
    blocks, more partial sums than one program adds at a time (SPLIT_PARTS)."""
    for rows, width in ((1, 16385), (5, 20001), (2, 40000)):
        (x,) = SOFTMAX.make_inputs((rows, width), torch.float32, "cpu", width)
        (dy,) = SOFTMAX.make_inputs((rows, width + 3), torch.float32, "cpu", width + 1)
        dy, y = dy[:, 3:], torch.softmax(x, -1)
        assert plans.backward_split_block(rows, width, st.INTERPRETER_PROGRAMS, launch.params(x.device))
        dxs = []
        for _ in range(2):
            dx = torch.full_like(x, float("nan"))
            st.launch_backward(y, dy, dx)
            dxs.append(dx)
        assert rel_err(dxs[0], reference_grad(x, dy)) <= SOFTMAX.tolerance[torch.float32], f"{rows} x {width}"
        assert torch.equal(dxs[0], dxs[1])
    (x,) = SOFTMAX.make_inputs((2, 3001), torch.float32, "cpu", 7)
    (dy,) = SOFTMAX.make_inputs((2, 3001), torch.float32, "cpu", 8)
    y, dx = torch.softmax(x, -1), torch.full_like(x, float("nan"))
    tiny = {
        **launch.params(x.device),
        "backward_split": {"below_rows_per_sm": 2, "programs_per_sm": 1, "blocks": [16, 16]},
    }
    assert plans.ceil_div(3001, 16) > st.SPLIT_PARTS
    launch.BACKWARD["looped"](y, dy, dx, st.Plan("looped", 64), tiny)(y, dy, dx)
    assert rel_err(dx, reference_grad(x, dy)) <= SOFTMAX.tolerance[torch.float32]


@interpreter_quiet
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16), ids=str)
def test_cpu_triton_held_rows(dtype: torch.dtype) -> None:
    """16-bit rows held in their storage type between the passes (Plan.hold; under the interpreter the bf16 bit-shift
    conversion runs, the PTX ones fall back to .to): sliced rows, 1 and 4 rows per program, special rows."""
    for width in PATH_WIDTHS:
        (wide,) = SOFTMAX.make_inputs((13, width + 5), dtype, "cpu", width)
        x = wide[:, 2 : 2 + width]
        for rows in (1, 4):
            plan = st.Plan("rows", next_power_of_2(width), rows=rows, hold=True)
            y = torch.full(x.shape, float("nan"), dtype=dtype)
            st.launch_forward(x, y, plan)
            assert rel_err(y, reference(x)) <= SOFTMAX.tolerance[dtype], f"{plan}, width {width}"
            specials = special_rows(dtype, "cpu", width)
            y = torch.full_like(specials, float("nan"))
            st.launch_forward(specials, y, plan)
            assert_softmax_like_torch(y, specials, f"{plan}, width {width}")


@interpreter_quiet
@pytest.mark.parametrize("kind", ["split", "split_pairs"])
def test_cpu_triton_split_kernels_leave_their_counters_zeros(kind: str) -> None:
    """The split kernels' workspace is kept from call to call (`launcher.workspace`: no allocation, no memset): they
    set their ticket and row counters back to zero before they end, so it is zeros after every launch, and the next
    launch (with more rows: the buffer grows) is right."""
    from fuselab.ops import launcher

    for rows in (3, 11, 11):
        (x,) = SOFTMAX.make_inputs((rows, 64), torch.bfloat16, "cpu", rows)
        y = torch.full_like(x, float("nan"))
        st.launch_forward(x, y, st.Plan(kind, 64))
        assert rel_err(y, reference(x)) <= SOFTMAX.tolerance[torch.bfloat16], f"{kind}, {rows} rows"
        sync = launcher.workspace("softmax split sync", 1 + rows, torch.int32, x.device)
        assert sync.numel() == 1 + rows and not sync.any(), sync


def test_alignment_in_elements() -> None:
    """How many elements (up to 16 bytes) the width and the row strides are all multiples of."""
    assert st.alignment(torch.empty(5, 17000, dtype=torch.bfloat16)) == 8  # 34000-byte rows: 16-byte vectors
    assert st.alignment(torch.empty(5, 32768, dtype=torch.bfloat16)) == 8
    assert st.alignment(torch.empty(5, 17002, dtype=torch.bfloat16)) == 2
    assert st.alignment(torch.empty(5, 1000)) == 4
    assert st.alignment(torch.empty(5, 1001)) == 1
    wide = torch.empty(5, 1030)
    assert st.alignment(wide[:, 2:1002]) == 2  # width 1000, row stride 1030
    assert st.alignment(torch.empty(5, 1000), wide[:, 2:1002]) == 2  # every tensor counts
    assert st.alignment(torch.empty(1, 24).expand(3, 24)) == 4  # row stride 0
    assert st.alignment(torch.empty(1, 2**31 + 8, dtype=torch.bfloat16, device="meta")) == 1  # kernels use int32


def test_triton_plans_by_width(monkeypatch: pytest.MonkeyPatch) -> None:
    """The automatic choice: short rows several to a program (~TILE_BYTES each, SHORT_WARPS), rows up to ROW_MAX
    whole (bf16 rows of 16384-32768 held in bf16, fp16 rows of 32768 persistent and a row ahead; registers capped at
    some widths), wider rows split
    across programs on a GPU (one chunk per SM at most; bf16 of even width in pairs) or looped."""
    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    f32, bf16, f16 = torch.float32, torch.bfloat16, torch.float16
    assert st.forward_plan(128, f32, cpu) == st.Plan("rows", 128, rows=8, num_warps=1)
    assert st.forward_plan(128, bf16, cpu) == st.Plan("rows", 128, rows=16, num_warps=4)
    assert st.forward_plan(1, f32, cpu) == st.Plan("single", 1024, rows=1, num_warps=4)  # elementwise
    assert st.forward_plan(2, f32, cpu) == st.Plan("rows", 2, rows=st.TILE_BYTES["4"] // 8, num_warps=1)
    assert st.forward_plan(129, f32, cpu) == st.Plan("rows", 256, rows=4, num_warps=1)
    assert st.forward_plan(1024, f32, cpu) == st.Plan("rows", 1024, rows=1, num_warps=1)
    assert st.forward_plan(2048, f32, cpu) == st.Plan("rows", 2048, rows=1, num_warps=4)
    assert st.forward_plan(4096, f32, cpu) == st.Plan("rows", 4096, rows=1, num_warps=16)
    assert st.forward_plan(4096, bf16, cpu) == st.Plan("rows", 4096, rows=1, num_warps=4)
    assert st.ROW_MAX == 32768
    assert st.forward_plan(32768, f32, cpu) == st.Plan("rows", 32768, rows=1, num_warps=32)
    assert st.forward_plan(512, f32, cpu) == st.Plan("rows", 512, rows=2, num_warps=1)
    # A GPU never tuned: no register caps, no held rows, no row ahead.
    assert st.forward_plan(512, bf16, cpu) == st.Plan("rows", 512, rows=4, num_warps=4)
    assert st.forward_plan(16384, bf16, cpu) == st.Plan("rows", 16384, rows=1, num_warps=16)
    assert st.forward_plan(32768, f16, cpu) == st.Plan("rows", 32768, rows=1, num_warps=16)
    # The H200's table (plans/nvidia-h200-sm90.json) adds them.
    h200 = plans.rule_params(tuning.key_of("NVIDIA H200", 9, 0))

    def on_h200(width: int, dtype: torch.dtype) -> st.Plan:
        return plans.choose_forward(width, dtype.itemsize, dtype == bf16, None, h200)

    assert on_h200(512, bf16) == st.Plan("rows", 512, rows=2, num_warps=4, maxnreg=32)  # maxnreg, 2 KiB tiles
    assert on_h200(16384, bf16) == st.Plan("rows", 16384, 1, 16, maxnreg=40, hold=True)  # held_bf16
    assert on_h200(16384, f16) == st.Plan("rows", 16384, rows=1, num_warps=16, maxnreg=40)  # maxnreg
    # A cap brings the warps it was fitted at (on 8 warps fp16 rows of 16 384 under the cap of 16 spilled, 3.16x);
    # rows read with edges have no cap and take the rules' warps
    on_8 = {**h200, "wide_warps": {"4": 8, "2": 8}, "short_warps": {"4": 1, "2": 2}}
    assert plans.choose_forward(16384, 2, False, None, on_8) == st.Plan("rows", 16384, 1, num_warps=16, maxnreg=40)
    assert plans.choose_forward(16384, 2, False, None, on_8, "edges") == st.Plan("rows", 16384, 1, num_warps=8)
    assert plans.choose_forward(512, 2, False, None, on_8).num_warps == 4
    # Tiles of short rows: tile_bytes, but at least least_rows rows where one fits (16-bit rows of 1024 two to a tile)
    small = {**h200, "tile_bytes": {"4": 4096, "2": 2048}, "least_rows": {"4": 1, "2": 2}}
    assert [plans.rows_plan(b, 2, small).rows for b in (128, 256, 512, 1024, 2048)] == [8, 4, 2, 2, 1]
    assert [plans.rows_plan(b, 4, small).rows for b in (256, 1024, 2048)] == [4, 1, 1]
    assert st.backward_plan(512, bf16) == st.Plan("rows", 512, rows=4, num_warps=4)  # no caps backward
    assert on_h200(16385, bf16) == st.Plan("rows", 32768, rows=1, num_warps=32, hold=True)
    assert on_h200(32768, bf16) == st.Plan("rows", 32768, rows=1, num_warps=32, hold=True)
    assert on_h200(16385, f16) == st.Plan("rows_ahead", 32768, rows=1, num_warps=32)  # ahead
    assert on_h200(32768, f16) == st.Plan("rows_ahead", 32768, rows=1, num_warps=32)
    assert not any(on_h200(w, d).hold for w in (1, 512, 8192, 32768) for d in (f32, f16))
    assert st.forward_plan(32769, f32, cpu).kernel == "looped"  # the interpreter cannot wait: no split
    assert st.forward_plan(65536, bf16, cpu).kernel == "looped"
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(launch, "sm_count", lambda index: 132)
    assert st.forward_plan(32769, f32, gpu) == st.Plan("split", 16384, num_warps=16)
    assert st.forward_plan(65536, bf16, gpu) == st.Plan("split_pairs", 8192, num_warps=4)
    assert st.forward_plan(65537, bf16, gpu) == st.Plan("split", 8192, num_warps=8)  # odd: no pairs
    assert st.forward_plan(65536, f16, gpu) == st.Plan("split", 8192, num_warps=8)
    assert st.forward_plan(2**20, bf16, gpu).kernel == "split_pairs"  # 128 chunks of 8192 on 132 SMs
    assert st.forward_plan(132 * 16384 + 1, f32, gpu).kernel == "looped"
    assert st.backward_plan(st.BACKWARD_ROW_MAX, f32).kernel == "rows"
    assert st.backward_plan(st.BACKWARD_ROW_MAX + 1, f32).kernel == "looped"


def test_triton_plans_by_how_rows_are_read() -> None:
    """Rows read with edges (misaligned, at least edge_min_bytes) and shorter than a tile run on one warp per
    edge_warp_bytes of tile, with no register cap (on the H200 bf16 rows of 325 columns took 4x as long on four
    warps with the cap); rows read element by element go in tiles of scalar_tile (4 elements a thread), those wider
    than the tile one to a program on a vector-read row's warps; rows read in vectors keep the plans above."""
    h200 = plans.rule_params(tuning.key_of("NVIDIA H200", 9, 0))

    def on_h200(width: int, itemsize: int, reads: str) -> st.Plan:
        return plans.choose_forward(width, itemsize, itemsize == 2, 132, h200, reads)

    assert on_h200(512, 2, "vectors") == st.Plan("rows", 512, rows=2, num_warps=4, maxnreg=32)
    assert on_h200(325, 2, "edges") == st.Plan("rows", 512, rows=2, num_warps=1)
    assert on_h200(524, 2, "edges") == st.Plan("rows", 1024, rows=2, num_warps=1)  # least_rows: two to a tile
    assert on_h200(1697, 2, "edges") == st.Plan("rows", 2048, rows=1, num_warps=4)  # a row as long as a tile
    small = {**h200, "least_rows": {"4": 1, "2": 1}}  # a row of 1024 fills a tile alone: still one warp
    assert plans.choose_forward(524, 2, True, 132, small, "edges") == st.Plan("rows", 1024, rows=1, num_warps=1)
    assert plans.choose_forward(325, 2, True, 132, small, "edges") == st.Plan("rows", 512, rows=2, num_warps=1)
    assert plans.choose_forward(1697, 2, True, 132, small, "edges") == st.Plan("rows", 2048, rows=1, num_warps=4)
    assert on_h200(13995, 2, "edges").hold  # held rows were fitted with edges among them
    # padded to 32: scalar_tile's 4 warps (on one warp, 18 166 x 29 took 1.6x as long on the H200)
    assert on_h200(25, 4, "scalars") == st.Plan("rows", 32, rows=16, num_warps=4)
    assert on_h200(53, 2, "scalars") == st.Plan("rows", 64, rows=8, num_warps=1)  # padded to 64: scalar_wide's one
    assert on_h200(13, 4, "scalars") == st.Plan("rows", 16, rows=32, num_warps=4)
    assert on_h200(1, 2, "scalars") == st.Plan("single", 2048, rows=1, num_warps=4)  # one column: elementwise
    no_single = {**h200, "single_column": [0, 4]}
    assert plans.choose_forward(1, 2, True, 132, no_single, "scalars") == st.Plan("rows", 1, rows=512, num_warps=4)
    assert on_h200(300, 2, "scalars") == st.Plan("rows", 512, rows=1, num_warps=1)  # the widest in a scalar tile
    # wider: a row a program on the warps of a row read in vectors (not one warp: 512 values a thread at 16384)
    assert on_h200(9248, 4, "scalars") == st.Plan("rows", 16384, rows=1, num_warps=16)
    assert on_h200(1500, 4, "scalars") == st.Plan("rows", 2048, rows=1, num_warps=4)
    assert plans.choose_backward(9248, 4, h200, "scalars") == st.Plan("rows", 16384, rows=1, num_warps=16)
    assert on_h200(16385, 2, "vectors") == st.Plan("rows", 32768, rows=1, num_warps=32, hold=True)
    assert on_h200(16386, 2, "edges").hold  # held bf16 rows have an edges path
    fp16 = plans.choose_forward(16386, 2, False, 132, h200, "vectors")
    assert fp16.kernel == "rows_ahead"  # one row ahead: vectors only (it has no edges path)
    assert plans.choose_forward(16385, 2, False, 132, h200, "edges") == st.Plan("rows", 32768, rows=1, num_warps=8)
    assert on_h200(25, 4, "vectors") == st.Plan("rows", 32, rows=32, num_warps=1)
    assert plans.choose_backward(325, 2, h200, "edges") == st.Plan("rows", 512, rows=2, num_warps=1)
    assert plans.choose_backward(10725, 4, h200, "edges").kernel == "rows"  # up to 16384 held whole
    assert set(plans.READS) == {"vectors", "edges", "scalars"}
    # The rows of real tensors: how the launchers see them.
    x = torch.empty(37, 325, dtype=torch.bfloat16)
    assert launch.reads(x, torch.empty_like(x), min_bytes=128) == "edges"
    x = torch.empty(37, 25)
    assert launch.reads(x, torch.empty_like(x), min_bytes=128) == "scalars"
    x = torch.empty(37, 24)
    assert launch.reads(x, torch.empty_like(x), min_bytes=128) == "vectors"


def test_backward_splits_few_wide_rows() -> None:
    """Fewer rows than 2 per SM: a wide row's backward is split over programs of 1024-4096 columns, at least 4 per
    SM where the row allows; more rows: one looped program each."""
    p = plans.rule_params(None)
    assert plans.backward_split_block(264, 100_000, 132, p) is None
    assert plans.backward_split_block(263, 100_000, 132, p) == 4096  # 263 x 25 programs
    assert plans.backward_split_block(2, 897_721, 132, p) == 2048  # 2 x 439 programs: at least 4 per SM
    assert plans.backward_split_block(1, 151_936, 132, p) == 1024  # 149 programs: as many as 1024 gives
    assert plans.backward_split_block(3, 9001, 3, p) == 2048  # the interpreter counts 3 "SMs"


@interpreter_quiet
def test_cpu_triton_split_pairs_bf16() -> None:
    """The bf16 split kernel that holds columns in int32 pairs (one chunk per row here, as the split kernel above):
    even widths, special rows, and rows it cannot read in pairs (odd width, odd row stride, odd offset), which go
    to the plain split kernel instead."""
    for width in (2, 64, 300):
        (x,) = SOFTMAX.make_inputs((11, width), torch.bfloat16, "cpu", width)
        for case in (x, special_rows(torch.bfloat16, "cpu", width)):
            y = torch.full_like(case, float("nan"))
            st.launch_forward(case, y, st.Plan("split_pairs", next_power_of_2(width)))
            assert_softmax_like_torch(y, case, f"split_pairs width {width}")
    (wide,) = SOFTMAX.make_inputs((7, 131), torch.bfloat16, "cpu", 9)
    for view in (wide[:, :65], wide[:, 1:65], wide[:, :64]):  # odd width, odd offset, odd row stride
        assert not st.in_pairs(view)
        y = torch.full(view.shape, float("nan"), dtype=view.dtype)
        st.launch_forward(view, y, st.Plan("split_pairs", 128))
        assert rel_err(y, reference(view)) <= SOFTMAX.tolerance[torch.bfloat16], f"{view.shape} {view.stride()}"


# Launches each Triton kernel as the automatic choice would (fp32 and bf16) and compiles what it launched for sm_90;
# then the held bf16 rows of 32768 alone, for their registers. In a fresh process: Triton 3.6's interpreter leaves
# triton.language.core patched after a kernel calls a library @jit function (tl.max, tl.sum), and the compiler then
# fails on the patched builtins.
COMPILE_OFFLINE = """
import json, torch
import fuselab
from fuselab.ops.softmax import launch
from fuselab.ops.softmax import plans
from fuselab.ops.softmax.plans import next_power_of_2
from fuselab.ops.softmax import triton as st
from fuselab.profile.inspect import triton_compile_offline

def launch_all():
    for dtype in (torch.float32, torch.bfloat16):
        for width, plan in ((1, None), (128, None), (512, None), (4096, None), (16384, None),  # bf16 512, 16384: capped
                            (1000, None), (17000, None),  # 16-byte rows whose width is no multiple of 16
                            (129, None), (1025, None),  # odd: aligned bulk + edges
                            (50257, st.Plan("split", 8192, num_warps=8)),  # odd, split, with edges
                            (40000, st.Plan("split", 16384, num_warps=16)),
                            (40004, st.Plan("split", 16384, num_warps=16)),  # fp32 vectors, width no multiple of 16
                            (40000, st.Plan("split_pairs", 8192, num_warps=4)),  # bf16 only; else split
                            (40008, st.Plan("split_pairs", 8192, num_warps=4)),  # 20 004 pairs: no multiple of 16
                            (70000, None), (20000, None)):  # looped (no split on the CPU), a wide row (bf16: held)
            x = torch.empty(64, width, dtype=dtype)
            st.launch_forward(x, torch.empty_like(x), plan)
            st.launch_backward(x, x, torch.empty_like(x))  # 17000: looped backward; 50257, 40004: with edges
        for width in (20000, 20001):  # few wide rows: the backward split over programs, with edges at 20001
            x = torch.empty(2, width, dtype=dtype)
            st.launch_backward(x, x, torch.empty_like(x))
    x = torch.empty(64, 20000, dtype=torch.bfloat16)  # chosen for fp16 rows of 32768
    st.launch_forward(x, torch.empty_like(x), st.Plan("rows_ahead", 32768, num_warps=32))

def launch_held():
    x = torch.empty(64, 32768, dtype=torch.bfloat16)
    st.launch_forward(x, torch.empty_like(x))

def described(kernels):
    return [{"name": k.name, "loads": [a.bytes for a in k.loads], "stores": [a.bytes for a in k.stores],
             "registers": k.resources.registers, "spills": k.resources.spill_stores} for k in kernels]

launch.interpreted = lambda: False  # compile what a GPU runs (inline PTX: fast exp, conversions, pairs)
launch.params = lambda device: plans.rule_params("nvidia-h200-sm90")  # the H200's plans: register caps, held rows
print(json.dumps({"all": described(triton_compile_offline(list(st.TRITON_KERNELS), launch_all, "sm_90")),
                  "held": described(triton_compile_offline(list(st.TRITON_KERNELS), launch_held, "sm_90"))}))
"""


@pytest.mark.slow
def test_triton_kernels_compile_for_sm_90() -> None:
    """Every Triton kernel compiles for sm_90 without a GPU, with 16-byte loads and stores (rows whose width is a
    multiple of 16 bytes but not of 16 elements too) and (where ptxas is found) no register spills, register caps
    included; held bf16 rows of 32768 at 32 warps take at most 32 registers, so two programs fit on an SM."""
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", COMPILE_OFFLINE], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    compiled = json.loads(done.stdout.strip().splitlines()[-1])
    names = {k.fn.__name__ if hasattr(k, "fn") else k.__name__ for k in st.TRITON_KERNELS}
    assert {k["name"] for k in compiled["all"]} == names
    for k in compiled["all"] + compiled["held"]:
        assert 16 in k["loads"], f"{k['name']}: no 16-byte loads: {k['loads']}"
        one_value = k["name"] == "_backward_partial_dot_kernel"  # stores one sum per program
        assert 16 in k["stores"] or one_value, f"{k['name']}: no 16-byte stores: {k['stores']}"
        assert not k["spills"], f"{k['name']}: {k['spills']} bytes of register spills"
    (held,) = compiled["held"]
    if held["registers"] is not None:  # None where no ptxas was found
        assert held["registers"] <= 32, held


# ---------------------------------------------------------------------------------------------- gradients


@interpreter_quiet
@pytest.mark.parametrize("shape", [(37, 129), (3, 20000), (4, 5, 33)], ids=str)  # (3, 20000): the split backward
@pytest.mark.parametrize("name", ["naive", "torch", "triton"])
def test_cpu_gradient_matches_reference(name: str, shape: tuple[int, ...]) -> None:
    (x,) = SOFTMAX.make_inputs(shape, torch.float32, "cpu", 4)
    (dy,) = SOFTMAX.make_inputs(shape, torch.float32, "cpu", 5)
    x.requires_grad_()
    run(name, x).backward(dy)
    assert rel_err(x.grad, reference_grad(x, dy)) <= SOFTMAX.tolerance[torch.float32]


@interpreter_quiet
def test_cpu_triton_gradient_of_expanded_upstream() -> None:
    """(y * w).sum() sends back a gradient broadcast along the rows (stride 0): read in place, no copy needed."""
    (x,) = SOFTMAX.make_inputs((129, 37), torch.float32, "cpu", 6)
    x = x.t().requires_grad_()
    w = torch.randn(129)
    (run("triton", x) * w).sum().backward()
    assert rel_err(x.grad, reference_grad(x, w.expand(37, 129))) <= SOFTMAX.tolerance[torch.float32]


@interpreter_quiet
def test_cpu_empty_and_scalar() -> None:
    for name in ("naive", "torch", "triton"):
        for shape in ((0, 5), (5, 0), (2, 0, 3)):
            x = torch.empty(shape, requires_grad=True)
            out = run(name, x)
            assert out.shape == shape
            out.sum().backward()
            assert x.grad.shape == shape
        assert run(name, torch.tensor(-2.5)).item() == 1.0


# ---------------------------------------------------------------------------------------------- errors
# (the contract test has the dtype, device and non-tensor ones)


@interpreter_quiet
def test_cpu_triton_random_shapes_forward_and_backward() -> None:
    """Ten shapes drawn afresh each run (1-3 leading dims, rows of 1-3000 columns, odd ones mostly, a quarter of them
    sliced views) through the impl as users call it: output and gradient against float64 (the gradient held to
    ||y * dy||, the op's gradient scale: rows of one column have dx = 0 by the math). The seed is in the message."""
    from fuselab.evaluate.cases import fresh_seed

    seed = fresh_seed()
    rng = random.Random(seed)
    for _ in range(10):
        width = rng.choice([1, 2, 3, rng.randint(4, 64), rng.randint(65, 1100), rng.randint(1101, 3000)])
        lead = [rng.randint(1, 40) for _ in range(rng.randint(1, 3))]
        lead[0] = max(1, min(lead[0], 20000 // (width * math.prod(lead[1:]))))
        sliced = rng.random() < 0.25
        (base,) = SOFTMAX.make_inputs((*lead, width + 5 * sliced), torch.float32, "cpu", rng.randrange(1 << 30))
        x = (base[..., 5:] if sliced else base).requires_grad_()
        (dy,) = SOFTMAX.make_inputs(tuple(x.shape), torch.float32, "cpu", rng.randrange(1 << 30))
        y = SOFTMAX.get_impl("triton")(x)
        y.backward(dy)
        case = f"seed {seed}: shape {tuple(x.shape)}{', sliced' if sliced else ''}"
        assert rel_err(y, reference(x.detach())) <= SOFTMAX.tolerance[torch.float32], case
        scale = SOFTMAX.gradient_scale(x.detach(), dy)
        err = gradient_error([x.grad], [reference_grad(x, dy)], scale)
        assert err <= SOFTMAX.tolerance[torch.float32], f"{case}: gradient error {err:.2e}"


def test_backward_rejects_mismatched_gradient() -> None:
    y = torch.softmax(torch.randn(3, 5), -1)
    with pytest.raises(ValueError, match=r"softmax triton backward: dy \(3, 4\).*must match y \(3, 5\)"):
        torch.ops.fuselab.softmax_triton_backward(y, torch.randn(3, 4))


# ---------------------------------------------------------------------------------------------- nn.Softmax


def test_module_dim_and_repr() -> None:
    """torch.nn.Softmax's signature: dim first; fuselab.nn exposes the class (the contract test checks every impl as a
    drop-in)."""
    assert repr(Softmax(-1, impl="torch")) == "Softmax(dim=-1, impl='torch')"
    from fuselab.nn import Softmax as NNSoftmax

    assert NNSoftmax is Softmax


# ---------------------------------------------------------------------------------------------- GPU
# (the contract test covers every impl x dtype x check shape with gradients, opcheck and compile)

# Widths around every threshold of both fused impls. Triton: rows kernel with 16/8/.../1 rows per program up to
# 32768 (bf16 rows of 16384-32768 held in bf16, fp16 from 16385 persistent and a row ahead; 1000, 17000: 16-byte
# rows whose width is no multiple of 16), split from 32769 (up to 132 chunks of 8192 on an H200),
# looped past that. CUDA: sub-warp groups up to 32
# packs, a warp up to 1024 columns (the backward: 512), then a block per span of a row (test_gpu_cuda_spans_*).
GPU_WIDTHS = (1, 2, 7, 31, 32, 33, 128, 129, 256, 1000, 1024, 1025, 2048, 4096, 8191, 16384, 16385, 17000, 24000,
              32768, 32769, 50000)  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", FUSED)
def test_gpu_every_width_path(name: str, dtype: torch.dtype) -> None:
    for width in GPU_WIDTHS:
        rows = max(3, min(3000, 2**19 // width))
        check_against_reference(name, (rows, width), dtype, "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gpu_triton_forced_paths(dtype: torch.dtype) -> None:
    """Each Triton kernel away from where the choice puts it: the split kernel with small chunks and many rows (many
    programs waiting for each other at once), the looped kernel on widths the others would take, the persistent
    rows-ahead kernel with many tiles per program, held 16-bit rows at other widths and rows per program."""
    plans = (
        st.Plan("split", 1024, num_warps=4),
        st.Plan("split", 128, num_warps=4),
        st.Plan("split_pairs", 1024, num_warps=4),  # bf16 of even width in pairs, else the split kernel
        st.Plan("split_pairs", 256, num_warps=1),
        st.Plan("looped", 1024),
    )
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for shape in ((3000, 5000), (7, 16385), (100, 7)):
        (x,) = SOFTMAX.make_inputs(shape, dtype, "cuda", 12)
        for plan in plans:
            if plan.kernel.startswith("split") and -(-shape[1] // plan.block) > sms:
                continue  # more chunks than SMs: the choice never splits so finely (all must fit at once)
            y = torch.full_like(x, float("nan"))
            st.launch_forward(x, y, plan)
            assert rel_err(y, reference(x)) <= SOFTMAX.tolerance[dtype], f"{plan} {shape}"
    for shape, rows, warps in (
        ((3001, 5000), 1, 8),
        ((20001, 100), 8, 4),
        ((5000, 32768), 1, 32),
        ((1000, 24001), 1, 16),
    ):
        (x,) = SOFTMAX.make_inputs(shape, dtype, "cuda", 13)
        block = next_power_of_2(shape[1])
        for plan in (st.Plan("rows_ahead", block, rows, warps), st.Plan("rows", block, rows, warps, hold=True)):
            y = torch.full_like(x, float("nan"))
            st.launch_forward(x, y, plan)
            assert rel_err(y, reference(x)) <= SOFTMAX.tolerance[dtype], f"{plan} {shape}"


@pytest.mark.gpu
@pytest.mark.parametrize("name", FUSED)
def test_gpu_many_rows_and_wide_rows(name: str) -> None:
    """More rows than a 65535 grid dimension, in every short-row configuration; rows of 2^20 (split / looped)."""
    for shape in ((70000, 3), (100003, 128), (65537, 1000), (3, 2**20), (2, 2**20 + 3)):
        for dtype in (torch.float32, torch.bfloat16):
            check_against_reference(name, shape, dtype, "cuda")


# The CUDA span plans (softmax.cu `span_plan`): one row cut into many spans where rows are fewer than SMs (1 x 1025
# up to 2 x 694 237), rows of whole spans (131 x 5000, 300 x 16 385), odd widths read as a 16-byte bulk and edges,
# rows past 132 spans (looped: 2 x 5 000 001 forward and backward, 3 x 1 100 001 backward only), fp32 rows of
# 28 672 and 32 000 whole in one block of 1024 threads (28 and 32 values a thread; 16-bit ones already were).
CUDA_SPAN_SHAPES = ((1, 1025), (3, 513), (1, 256000), (2, 694237), (7, 20001), (13, 3001), (131, 5000), (300, 16385),
                    (3, 1100001), (2, 5000001), (29, 28672), (52, 32000))  # fmt: skip


def _rows_at_offset(rows: int, width: int, offset: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, ...]:
    """x and dy, (rows, width) on the GPU, starting `offset` elements into rows of width + offset (offset 1: rows not
    on a 16-byte boundary); the allocator then NaN-poisoned, so outputs start as NaN."""
    (x,) = SOFTMAX.make_inputs((rows, width + offset), dtype, "cuda", seed)
    (dy,) = SOFTMAX.make_inputs((rows, width + offset), dtype, "cuda", seed + 1)
    x, dy = x[:, offset:], dy[:, offset:]
    poison_allocator(x.numel() * x.element_size(), "cuda")
    return x, dy


def _exact_backward(y: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """softmax's gradient in float64 from its own (rounded) output y and upstream dy."""
    y64, dy64 = y.double(), dy.double()
    return y64 * (dy64 - (y64 * dy64).sum(-1, keepdim=True))


def _check_cuda_rows(shapes: tuple, dtype: torch.dtype, seed: int, repeat: bool) -> None:
    """The CUDA impl's forward and backward at each (rows, width) of `shapes`, rows on a 16-byte boundary and off it
    (offset 1), into NaN-poisoned outputs, against float64; `repeat`: and bitwise the same on a second call."""
    fl = torch.ops.fuselab
    tol = SOFTMAX.tolerance[dtype]
    for (rows, width), offset in itertools.product(shapes, (0, 1)):
        x, dy = _rows_at_offset(rows, width, offset, dtype, seed=seed)
        y = fl.softmax_cuda(x)
        assert rel_err(y, reference(x)) <= tol, f"forward {dtype} {rows}x{width} offset {offset}"
        assert not repeat or torch.equal(y, fl.softmax_cuda(x)), f"forward repeat {rows}x{width}"
        y_in = torch.empty((rows, width + offset), dtype=dtype, device="cuda")[:, offset:].copy_(y)
        poison_allocator(x.numel() * x.element_size(), "cuda")
        dx = fl.softmax_cuda_backward(y_in, dy)
        assert rel_err(dx, _exact_backward(y, dy)) <= tol, f"backward {dtype} {rows}x{width} offset {offset}"
        assert not repeat or torch.equal(dx, fl.softmax_cuda_backward(y_in, dy)), f"backward repeat {rows}x{width}"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gpu_cuda_spans_forward_and_backward(dtype: torch.dtype) -> None:
    """Every CUDA span plan, on rows that start on a 16-byte boundary and on rows that do not (x[:, 1:]: read element
    by element), forward and backward into NaN-poisoned outputs: right, and bitwise the same on a second call (which
    also shows the first left its scratch's counters zeros: else the second would wait forever or mix rows)."""
    _check_cuda_rows(CUDA_SPAN_SHAPES, dtype, seed=21, repeat=True)


# Short rows the CUDA impl stages through shared memory (softmax_plan.h's staged_plan): contiguous rows of no whole
# number of 16-byte packs (under the plan table's limits, fp32 rows up to 128 bytes and 16-bit up to 768; the others
# here go to the warp kernels, and to the staged ones in the run-time rules test below, whose limits are 2 KiB), from
# one row to more than a block's rows many times over (blocks of 8-4096 rows), a group of 1-32 threads a row; tensors
# too small to fill 4 blocks per SM (1553 x 12, 65 537 x 3) go to the warp kernels.
CUDA_STAGED_SHAPES = ((1, 1), (1, 12), (3, 1), (7, 5), (1553, 12), (100003, 5), (70001, 22), (5001, 577), (2049, 511),
                      (4099, 1023), (333, 301), (65537, 3), (300007, 3), (40009, 13), (200003, 1))  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gpu_cuda_staged_rows_forward_and_backward(dtype: torch.dtype) -> None:
    """Short rows staged through shared memory (contiguous, offset 0) and the same rows off 16-byte boundaries and
    strided (x[:, 1:], the warp and span kernels), forward and backward into NaN-poisoned outputs, against float64;
    a row holding -inf gives 0 there, a row all -inf gives NaN, as torch.softmax does."""
    fl = torch.ops.fuselab
    tol = SOFTMAX.tolerance[dtype]
    _check_cuda_rows(CUDA_STAGED_SHAPES, dtype, seed=41, repeat=True)
    (x,) = SOFTMAX.make_inputs((1000, 13), dtype, "cuda", 42)
    x[5, 3] = float("-inf")
    x[7] = float("-inf")
    y = fl.softmax_cuda(x)
    assert y[5, 3] == 0 and torch.isnan(y[7]).all() and not torch.isnan(torch.cat([y[:7], y[8:]])).any()
    keep = torch.ones(1000, dtype=torch.bool, device="cuda")
    keep[7] = False
    assert rel_err(y[keep], reference(x)[keep]) <= tol


# Rows off 16-byte boundaries (offset 1) of widths 1-1024 (head and tail edges of every length, one pack a lane up to
# four (16-bit) or eight (fp32)), for the edge warp kernels under run-time rules that send them all there.
CUDA_EDGE_WARP_SHAPES = ((1, 1), (3, 5), (1000, 7), (77, 31), (5001, 129), (22353, 532), (6594, 577), (501, 1021),
                         (300, 1024), (7, 333))  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gpu_cuda_edge_warp_rows_forward_and_backward(dtype: torch.dtype) -> None:
    """The edge warp kernels (edge_warp_row_bytes 4096, set at run time: every row of no whole pack of 512 bytes to 1024
    columns), forward and backward, rows on 16-byte boundaries and off them, into NaN-poisoned outputs, bitwise the
    same twice; a row holding -inf gives 0 there, a row all -inf NaN; the table's rules put back."""
    fl = torch.ops.fuselab
    index = torch.cuda.current_device()
    table = cuda.span_rules(index)
    try:
        cuda.configure(index, {**table, "edge_warp_row_bytes": 4096, "staged_row_bytes_fp32": 0,
                               "staged_row_bytes_16bit": 0})  # fmt: skip
        _check_cuda_rows(CUDA_EDGE_WARP_SHAPES, dtype, seed=51, repeat=True)
        x, _ = _rows_at_offset(100, 577, 1, dtype, seed=52)
        x[5, 3] = x[6, 576] = float("-inf")
        x[7] = float("-inf")
        y = fl.softmax_cuda(x)
        assert y[5, 3] == 0 and y[6, 576] == 0 and torch.isnan(y[7]).all()
        assert not torch.isnan(torch.cat([y[:7], y[8:]])).any()
    finally:
        cuda.configure(index, table)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gpu_triton_single_column_rows_elementwise(dtype: torch.dtype) -> None:
    """Rows of one column on the Triton impl's `single` plan: contiguous (a masked last program, or none) and strided
    (x[:, 1:] of two columns), forward and backward into NaN-poisoned outputs, against float64; y is exactly 1 where x
    is finite and NaN where it is +-inf or NaN, as torch.softmax."""
    tol = SOFTMAX.tolerance[dtype]
    for (rows, width), offset in itertools.product(((1, 1), (3, 1), (2048, 1), (70001, 1), (1000003, 1)), (0, 1)):
        x, dy = _rows_at_offset(rows, width, offset, dtype, seed=67)
        assert launch.forward_plan(1, dtype, x.device).kernel == "single"
        y = torch.full((rows, 1), float("nan"), dtype=dtype, device="cuda")
        st.launch_forward(x, y)
        assert rel_err(y, reference(x)) <= tol, f"forward {dtype} {rows} x 1 offset {offset}"
        dx = torch.full_like(y, float("nan"))
        st.launch_backward(y, dy, dx)
        assert rel_err(dx, _exact_backward(y, dy)) <= tol, f"backward {dtype} {rows} x 1 offset {offset}"
    x = torch.tensor([[1.5], [float("-inf")], [float("inf")], [float("nan")], [-3e4], [0.0]], dtype=dtype)
    y = torch.empty_like(x, device="cuda")
    st.launch_forward(x.cuda(), y)
    assert torch.equal(torch.isnan(y.cpu()), torch.isnan(torch.softmax(x.double(), -1)))
    assert (y[[0, 4, 5]] == 1).all()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gpu_cuda_single_column_rows_elementwise(dtype: torch.dtype) -> None:
    """Rows of one column elementwise (single_column_elementwise 1, set at run time): contiguous (16-byte packs and a
    tail) and strided (x[:, 1:] of two columns), forward and backward, bitwise the same twice; y is exactly 1 where x
    is finite and NaN where it is +-inf or NaN, as torch.softmax; the table's rules put back."""
    fl = torch.ops.fuselab
    index = torch.cuda.current_device()
    table = cuda.span_rules(index)
    try:
        cuda.configure(index, {**table, "single_column_elementwise": 1})
        _check_cuda_rows(((1, 1), (3, 1), (17, 1), (70001, 1), (1000003, 1)), dtype, seed=61, repeat=True)
        x = torch.tensor([[1.5], [float("-inf")], [float("inf")], [float("nan")], [-3e4], [0.0]], dtype=dtype)
        y = fl.softmax_cuda(x.cuda()).cpu()
        assert torch.equal(torch.isnan(y), torch.isnan(torch.softmax(x.double(), -1)))
        assert (y[[0, 4, 5]] == 1).all()
    finally:
        cuda.configure(index, table)


@pytest.mark.gpu
def test_gpu_cuda_spans_on_a_side_stream_and_in_a_cuda_graph() -> None:
    """Rows cut into spans meet through a scratch buffer kept per stream: a side stream gets its own, and a CUDA graph
    captures fresh zeros of its own, so its replays stay right while eager calls use the kept buffer between them."""
    fl = torch.ops.fuselab
    (x,) = SOFTMAX.make_inputs((2, 694237), torch.float32, "cuda", 23)
    (x2,) = SOFTMAX.make_inputs((3, 300001), torch.float32, "cuda", 24)
    tol = SOFTMAX.tolerance[torch.float32]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        y_side = fl.softmax_cuda(x)
        fl.softmax_cuda(x2)  # warm on the side stream, as graph capture asks
    torch.cuda.current_stream().wait_stream(side)
    assert rel_err(y_side, reference(x)) <= tol
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y_graph = fl.softmax_cuda(x)
    for _ in range(3):
        x.normal_()
        graph.replay()
        assert rel_err(fl.softmax_cuda(x2), reference(x2)) <= tol  # eager between replays
        torch.cuda.synchronize()
        assert rel_err(y_graph, reference(x)) <= tol


# (impl, backward, shape, dtype, fills, warm_on_capture_stream): captured calls, and the fills of PyTorch's their
# replays run (1 where the plan cuts rows into spans that meet; the CUDA cases' plans are pinned by
# test_the_capture_cases_fill_where_the_cuda_plans_cut_rows, on the CPU)
CAPTURE_CASES = [
    ("cuda", False, (29, 28672), torch.bfloat16, 0, False), ("cuda", False, (2, 694237), torch.float32, 1, False),
    ("cuda", True, (52, 48000), torch.bfloat16, 1, False), ("cuda", True, (52, 32000), torch.bfloat16, 0, False),
    ("triton", False, (2, 300001), torch.float32, 1, False), ("triton", False, (2, 300001), torch.float32, 1, True),
    ("triton", True, (2, 300001), torch.float32, 0, False), ("triton", False, (37, 325), torch.bfloat16, 0, False),
]  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize(("impl", "backward", "shape", "dtype", "fills", "warm_on_capture_stream"), CAPTURE_CASES)
def test_gpu_a_captured_call_zeroes_only_the_counters_its_spans_meet_by(
    impl: str, backward: bool, shape: tuple[int, int], dtype: torch.dtype, fills: int, warm_on_capture_stream: bool
) -> None:
    """Captured in a CUDA graph, a call's replays run the impl's kernels and at most one fill of PyTorch's: the zeros
    of the counters by which the spans of a row meet (a buffer of the graph's own), where rows are cut into spans.
    Scratch written before it is read is allocated, not zeroed, and a launch whose rows are not cut asks for none
    (each fill is a node every replay waits for). The replays' results are right. So too where the op was warmed, and
    its call recorded for replays, on the stream that then captures (a recipe holding the eager calls' counters is not
    replayed into the graph)."""
    op = getattr(torch.ops.fuselab, f"softmax_{impl}" + ("_backward" if backward else ""))
    (x,) = SOFTMAX.make_inputs(shape, dtype, "cuda", 29)
    y = torch.softmax(x.float(), -1).to(dtype)
    dy = torch.randn_like(x)
    args = (y, dy) if backward else (x,)
    want = _exact_backward(y, dy) if backward else reference(x)
    stream = torch.cuda.Stream() if warm_on_capture_stream else torch.cuda.current_stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):  # compiled, warm and recorded before the capture
            op(*args)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream if warm_on_capture_stream else None):
        out = op(*args)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    ran = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    pytorchs = [name for name in ran if name.startswith(("Memcpy", "Memset")) or "at::" in name]
    assert len(ran) > len(pytorchs), ran  # the impl's own kernels ran
    assert len(pytorchs) == fills, ran
    assert rel_err(out, want) <= SOFTMAX.tolerance[dtype]


# The GPU test's small rules, every rule given (a CPU test checks the names against cuda.SPAN_RULES).
SMALL_SPAN_RULES = {"threads": 128, "hold": 8, "backward_hold": 8, "min_span_bytes": 4096, "split_row_bytes": 16384,
                    "blocks_per_sm": 1, "scalar_warp_width_fp32": 1024, "scalar_warp_width_16bit": 1024,
                    "staged_row_bytes_fp32": 0, "staged_row_bytes_16bit": 0, "staged_packed_row_bytes": 0,
                    "staged_tile_bytes": 256, "staged_blocks_per_sm": 1, "edge_warp_row_bytes": 0,
                    "single_column_elementwise": 0, "one_wave": 0, "staged_lane_columns": 0}  # fmt: skip


@pytest.mark.gpu
def test_gpu_cuda_span_rules_set_at_run_time_change_the_plans_not_the_results() -> None:
    """`cuda.configure` hands other span rules to the launchers without a rebuild: blocks of 128 threads holding 8
    values, rows cut from 16 KiB into spans down to 4 KiB, one block per SM, no rows staged; then blocks of 1024
    threads, backward blocks holding 32 values (bf16 305 x 11 008: 512 threads x 3 packs, 16 x 16 384: 512 x 4,
    3 x 28 672: 1024 x 4, 16-bit packs held as stored), rows read one element at a time leaving the warp kernels past
    256 columns, and rows staged up to 2 KiB in tiles of 16 KiB (bf16 3001 x 900: 57 600 bytes of shared memory a
    backward block). Every span shape stays right forward and backward under them, rows on and off 16-byte
    boundaries, fp32 and bf16. Rules beyond the
    kernels' limits are a ValueError naming them (raised in Python before the binding is called); the table's rules
    are put back at the end."""
    fl = torch.ops.fuselab
    index = torch.cuda.current_device()
    table = cuda.span_rules(index)
    assert set(table) == set(cuda.SPAN_RULES)
    small = SMALL_SPAN_RULES
    wide = {**table, "threads": 1024, "backward_hold": 32, "scalar_warp_width_fp32": 256,
            "scalar_warp_width_16bit": 256, "staged_row_bytes_fp32": 2048, "staged_row_bytes_16bit": 2048,
            "staged_packed_row_bytes": 2048,
            "staged_tile_bytes": 16384, "staged_blocks_per_sm": 1, "edge_warp_row_bytes": 4096,
            "single_column_elementwise": 1, "one_wave": 1}  # fmt: skip
    shapes = ((1, 1025), (6, 5500), (7, 20001), (131, 5000), (613, 22711), (300, 16385), (129, 945), (2, 694237),
              (3, 1100001), (3001, 900), (20001, 7), (40001, 8), (5001, 301), (305, 11008), (16, 16384),
              (3, 28672))  # fmt: skip
    try:
        for rules, dtype, (rows, width), offset in itertools.product(
            (small, wide), (torch.float32, torch.bfloat16), shapes, (0, 1)
        ):
            cuda.configure(index, rules)
            (x,) = SOFTMAX.make_inputs((rows, width + offset), dtype, "cuda", 31)
            (dy,) = SOFTMAX.make_inputs((rows, width + offset), dtype, "cuda", 32)
            x, dy = x[:, offset:], dy[:, offset:]
            y = fl.softmax_cuda(x)
            case = f"{rules['threads']} threads {dtype} {rows}x{width} offset {offset}"
            assert rel_err(y, reference(x)) <= SOFTMAX.tolerance[dtype], f"forward {case}"
            exact = y.double() * (dy.double() - (y.double() * dy.double()).sum(-1, keepdim=True))
            assert rel_err(fl.softmax_cuda_backward(y, dy), exact) <= SOFTMAX.tolerance[dtype], f"backward {case}"
        with pytest.raises(ValueError, match=r"span rules beyond what the kernels are compiled for: threads 2048 "):
            cuda.configure(index, {**small, "threads": 2048})
        assert cuda.span_rules(index) == table  # the table is untouched, and calls under the kept rules run right
        (x,) = SOFTMAX.make_inputs((7, 20001), torch.float32, "cuda", 33)
        assert rel_err(fl.softmax_cuda(x), reference(x)) <= SOFTMAX.tolerance[torch.float32]
    finally:
        cuda.configure(index, table)


# Calls the CUDA binding refuses, made directly (past the op's Python checks, which users meet first), and what its
# message says: a device, a dtype, and numbers (sizes), which once crashed the process (docs/ops/softmax.md).
BINDING_REFUSALS = (
    ("x = torch.randn(3, 5); ext.forward(x, torch.empty_like(x))", "x must be a CUDA tensor, got one on cpu"),
    ("x = torch.randn(3, 5, device='cuda', dtype=torch.float64); ext.forward(x, x.clone())",
     "dtype Double is not supported"),
    ("x = torch.randn(2, 3, 5, device='cuda'); ext.forward(x, torch.empty_like(x))",
     "x must be 2-d (rows, width), got shape [2, 3, 5]"),
    ("x = torch.randn(3, 5, device='cuda'); ext.forward(x, torch.empty(3, 6, device='cuda'))",
     "y has shape [3, 6], not [3, 5]"),
    ("x = torch.randn(3, 5, device='cuda'); ext.forward(x, torch.empty(3, 5, device='cuda', dtype=torch.half))",
     "y has dtype Half, not Float"),
    ("y = torch.randn(3, 5, device='cuda'); ext.softmax_backward(y, torch.randn(3, 4, device='cuda'))",
     "dy has shape [3, 4], not y's [3, 5]"),
)  # fmt: skip
REFUSING = """
import torch
from fuselab.ops.softmax import cuda
ext = cuda.extension()
for call in CALLS:
    print("calling:", call, flush=True)
    try:
        exec(call)
        print("no error", flush=True)
    except RuntimeError as e:
        print("raised:", str(e).splitlines()[0], flush=True)
"""


@pytest.mark.gpu
def test_gpu_every_refusal_of_the_binding_raises_and_says_its_numbers() -> None:
    """Each check of the CUDA binding raises a RuntimeError naming what it refused, sizes included, in a process of
    its own: on the H200 machine an extension whose message inserted a number into an ostream died of SIGSEGV (the
    binding now makes its numbers text first, fuselab/ops/_cuda/text.h)."""
    src = str(Path(fuselab.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)}
    calls = [call for call, _ in BINDING_REFUSALS]
    code = f"CALLS = {calls!r}\n{REFUSING}"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    lines = done.stdout.splitlines()
    last = next((line for line in reversed(lines) if line.startswith("calling:")), "before the first call")
    assert done.returncode == 0, f"exit {done.returncode} at {last!r}: {done.stderr[-2000:]}"
    said = [line for line in lines if not line.startswith("calling:")]
    assert len(said) == len(BINDING_REFUSALS), lines
    for (call, expected), line in zip(BINDING_REFUSALS, said, strict=True):
        assert line.startswith("raised:") and expected in line, f"{call}: {line}"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", EAGER_IMPLS)
def test_gpu_non_contiguous_and_misaligned(name: str, dtype: torch.dtype) -> None:
    """Transposed and strided views, rows that start off 16-byte boundaries (x[:, 1:]), 3-d views, and rows whose
    width and stride are multiples of 16 bytes but not of 16 elements (x8[:, 8:1008]: 16-byte loads declared)."""
    (x,) = SOFTMAX.make_inputs((129, 1031), dtype, "cuda", 2)
    (x3,) = SOFTMAX.make_inputs((5, 64, 256), dtype, "cuda", 3)
    (x8,) = SOFTMAX.make_inputs((33, 1064), dtype, "cuda", 5)
    views = (x.t(), x[:, 1:], x[:, 1:-2], x[::2, 3:259], x3[:, 1:9, 1:], x3.transpose(0, 1), x8[:, 8:1008], x8[1:, 4:])
    for view in views:
        out = run(name, view)
        assert out.shape == view.shape and out.dtype == dtype
        assert rel_err(out, reference(view)) <= SOFTMAX.tolerance[dtype], f"{name} {view.shape} {view.stride()}"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", EAGER_IMPLS)
def test_gpu_special_rows_as_torch_softmax(name: str, dtype: torch.dtype) -> None:
    for width in (1, 3, 300, 5000, 20000, 70000, 70001):
        x = special_rows(dtype, "cuda", width)
        assert_softmax_like_torch(run(name, x), x, f"{name} {dtype} width {width}")


def test_a_nearly_one_hot_row_is_checked_against_the_terms_its_gradient_cancels() -> None:
    """At max y = 0.99 any backward from the saved bf16 y is ~0.1 off the exact gradient (PyTorch's own too): the
    check measures it against ||y * dy|| (SOFTMAX.gradient_scale), where a right backward is within tolerance and
    one that drops the sum term still fails."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(1000, generator=gen, dtype=torch.float64)
    x[17] = 12.0  # max y ~0.99
    dy = torch.randn(1000, generator=gen, dtype=torch.float64)
    x16 = x.to(torch.bfloat16).requires_grad_()
    torch.softmax(x16, -1).backward(dy.to(torch.bfloat16))
    x64 = x16.detach().double().requires_grad_()
    reference(x64).backward(dy)
    scale = SOFTMAX.gradient_scale(x64.detach(), dy=dy)
    tol = SOFTMAX.tolerance[torch.bfloat16]
    assert gradient_error([x16.grad], [x64.grad]) > 3 * tol  # against ||dx||: rounding of y, magnified
    assert gradient_error([x16.grad], [x64.grad], scale) <= tol
    y = reference(x64.detach())
    assert gradient_error([(y * dy).to(torch.bfloat16)], [x64.grad], scale) > 0.5  # no - y * sum(y * dy): wrong


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", EAGER_IMPLS)
def test_gpu_gradient_matches_reference(name: str, dtype: torch.dtype) -> None:
    """Gradients against float64, at rows of every backward path: wide rows of odd widths among them, whose bulk of
    16-byte vectors and edges the Triton impl's looped backward (278 x 17 729) and split one (5 x 40 001) read apart."""
    for shape in [(1, 1), (37, 129), (4, 5, 1000), (3, 9000), (2, 70000), (278, 17729), (5, 40001)]:
        (x,) = SOFTMAX.make_inputs(shape, dtype, "cuda", 4)
        (dy,) = SOFTMAX.make_inputs(shape, dtype, "cuda", 5)
        x.requires_grad_()
        run(name, x).backward(dy)
        assert x.grad.dtype == dtype
        err = rel_err(x.grad, reference_grad(x, dy))
        assert err <= SOFTMAX.tolerance[dtype], f"{name} {dtype} {shape}: grad rel err {err:.2e}"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gpu_compile_impl(dtype: torch.dtype) -> None:
    """The compiled impl, with few compilations (each costs seconds): special rows among random ones, forward and
    gradient, then a transposed input. `fuselab check softmax` covers it at every check shape."""
    x = special_rows(dtype, "cuda", 300).requires_grad_()
    (dy,) = SOFTMAX.make_inputs(x.shape, dtype, "cuda", 5)
    out = run("compile", x)
    assert_softmax_like_torch(out, x.detach(), f"compile {dtype}")
    out.backward(dy)
    finite = torch.isfinite(reference(x.detach())).all(-1)  # rows whose gradient is defined
    err = rel_err(x.grad[finite], reference_grad(x[finite], dy[finite]))
    assert err <= SOFTMAX.tolerance[dtype], f"compile {dtype}: grad rel err {err:.2e}"
    (x2,) = SOFTMAX.make_inputs((129, 37), dtype, "cuda", 6)
    assert rel_err(run("compile", x2.t()), reference(x2.t())) <= SOFTMAX.tolerance[dtype]


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.usefixtures("whole_gpu_memory")
@pytest.mark.parametrize("name", FUSED)
@pytest.mark.parametrize("width", [1000, 65536, 2**20])
def test_gpu_past_2_pow_31_elements(name: str, width: int) -> None:
    """Just over 2^31 bf16 elements (4 GiB) in rows of `width` (rows kernel / warp, split / looped, split / looped):
    row offsets need 64 bits. Forward and backward checked on the first rows, the rows across 2^31 and the last."""
    if torch.cuda.get_device_properties(0).total_memory < 40 * 2**30:
        pytest.skip("needs ~30 GiB of GPU memory")
    rows = 2**31 // width + 2
    (x,) = SOFTMAX.make_inputs((rows, width), torch.bfloat16, "cuda", 11)
    op_backward = getattr(torch.ops.fuselab, f"softmax_{name}_backward")
    y = SOFTMAX.get_impl(name)(x)
    (dy,) = SOFTMAX.make_inputs((rows, width), torch.bfloat16, "cuda", 12)  # with dy = 1 the exact gradient is 0
    dx = op_backward(y, dy)
    tol = SOFTMAX.tolerance[torch.bfloat16]
    across = 2**31 // width
    for part in (slice(0, 3), slice(across - 2, across + 2), slice(rows - 3, rows)):
        assert rel_err(y[part], reference(x[part])) <= tol, f"forward at rows {part}"
        # The backward kernel is given the rounded y, so it is held to the exact gradient of its own inputs:
        # from x, rows whose y is nearly one-hot lose digits in dy - sum(y * dy) that no kernel can recover.
        assert rel_err(dx[part], _exact_backward(y[part], dy[part])) <= tol, f"backward at rows {part}"


# ---------------------------------------------------------------------------------------------- tuner


@interpreter_quiet
def test_tuner_scores_candidates_and_writes_parameters(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tuner at tiny sizes on the CPU, its cases measured and chosen from as `fuselab tune` does: each
    candidate's plan is checked and timed beside torch.softmax, every candidate gets a score (>= 1: time over the
    best; the chosen ones together too, where more than one), and the table it would write holds rule parameters
    (the keys of plans.DEFAULTS), which launchers read back through tuning.params; a held-out check times the
    candidates it names beside the defaults only."""
    from fuselab.ops import tuning
    from fuselab.ops.softmax import plans, tune

    cases = tune.cases([(3, 129), (2, 5000)], [torch.float32])
    tuned = tuning.tune(tune, cases, torch.device("cpu"), True, False, log=lambda line: None)
    params, evidence = tuned.params, tuned.evidence
    assert tuned.failed == [] and tuned.ranks == [0, 0]
    assert set(params) == set(plans.DEFAULTS)
    combination = {" + ".join(evidence["chosen"])} if len(evidence["chosen"]) > 1 else set()
    assert set(evidence["scores"]) == set(tune.CANDIDATES) | combination
    assert all(v >= 1.0 for v in evidence["scores"].values())
    assert evidence["winner"] == (" + ".join(evidence["chosen"]) or "defaults")
    assert all(name in tune.CANDIDATES for name in evidence["chosen"])
    path = tuning.write_table(tmp_path, "test-gpu-sm90", {**params, "tile_bytes": {"4": 2048, "2": 2048}}, evidence)
    assert path == tmp_path / "plans" / "test-gpu-sm90.json"
    assert tuning.params(plans.DEFAULTS, tmp_path, "test-gpu-sm90")["tile_bytes"] == {"4": 2048, "2": 2048}
    assert tuning.params(plans.DEFAULTS, tmp_path, "never-tuned-sm80") == plans.DEFAULTS
    tuning.write_table(tmp_path, "bad-sm90", {"block_for_width_50257": 7}, {})
    with pytest.raises(ValueError, match="unknown parameters"):
        tuning.params(plans.DEFAULTS, tmp_path, "bad-sm90")
    # A held-out check (`fuselab tune --check`) times the named candidates alone beside the rules as they stand
    (held,) = tune.cases([(5, 300)], [torch.float32])
    checked = tune.measure(held, torch.device("cpu"), True, False, only=["tile 8 KiB"])
    assert set(checked["by_candidate"]) == {"defaults", "tile 8 KiB"}
    assert checked["plans"] and all(isinstance(ms, float) for ms in checked["plans"].values())
    with pytest.raises(ValueError, match="no candidate nothing"):
        tune.measure(held, torch.device("cpu"), True, False, only=["nothing"])


@pytest.mark.gpu
def test_gpu_the_tuner_times_each_candidates_launch_as_the_launcher_makes_it() -> None:
    """The tuner on the GPU at three cases of the committed draw's cliffs (millions of narrow rows read element by
    element, misaligned rows of 129 with edges, few fp32 rows past row_max): each candidate's launch runs with its
    rules, checked against the reference and timed, or its error reported; the scalar tiles are distinct launches,
    all right; `choose` keeps the GPU's table under what it picks."""
    from fuselab.ops.softmax import tune

    device = torch.device("cuda", torch.cuda.current_device())
    cases = tune.cases([(505169, 5)], [torch.float32]) + tune.cases([(3001, 129)], [torch.bfloat16])
    cases += tune.cases([(33, 40001)], [torch.float32])
    measured = [tune.measure(case, device, quick=True, compile_peer=False) for case in cases]
    for m in measured:
        defaults = m["by_candidate"]["defaults"]
        assert isinstance(m["plans"][defaults], float), (m["case"], m["plans"][defaults])
        assert all(isinstance(v, (float, str)) for v in m["plans"].values())
        assert m["base"] == launch.params(device)
    narrow = measured[0]
    tiles = {narrow["by_candidate"][name] for name in tune.CANDIDATES if name.startswith("scalar tile")}
    assert len(tiles) == 5 and all(isinstance(narrow["plans"][t], float) for t in tiles), narrow["plans"]
    assert all("reads=scalars" in t for t in tiles)
    assert "reads=edges" in measured[1]["by_candidate"]["defaults"]
    params, evidence = tune.choose(measured)
    table = tuning.params(plans.DEFAULTS, plans.FOLDER, tuning.reading_key(plans.FOLDER, device.index))
    untouched = set(table) - {key for name in evidence["chosen"] for key in tune.CANDIDATES[name]}
    assert {k: params[k] for k in untouched} == {k: table[k] for k in untouched}


# ---------------------------------------------------------------------------------------------- aligned bulk + edges


@interpreter_quiet
@pytest.mark.parametrize("width", [33, 129, 515, 1025])
def test_cpu_triton_edges_path_at_odd_widths(width: int) -> None:
    """Rows that are not whole 16-byte vectors (odd widths, contiguous, aligned buffers) take the aligned bulk +
    edges path in the rows, looped and one-chunk split kernels, and backward in the rows, looped and split
    (partial sums, then dx) kernels; each row's shift differs (row r starts at r * width), so heads and tails of
    every length are exercised (515: 3 past a multiple of 4, the others 1); float64 reference, NaN-poisoned outputs."""
    rows = 9
    (x,) = SOFTMAX.make_inputs((rows, width), torch.float32, "cpu", width)
    y = torch.full_like(x, float("nan"))
    assert launch.edges(x, y, min_bytes=plans.DEFAULTS["edge_min_bytes"])
    block = next_power_of_2(width)
    for plan in (st.Plan("rows", block, rows=2, num_warps=1), st.Plan("looped", 64), st.Plan("split", block)):
        y.fill_(float("nan"))
        st.launch_forward(x, y, plan)
        assert rel_err(y, reference(x)) <= SOFTMAX.tolerance[torch.float32], f"{plan}"
    (dy,) = SOFTMAX.make_inputs((rows, width), torch.float32, "cpu", width + 1)
    ys = torch.softmax(x, -1)
    dx = torch.full_like(x, float("nan"))
    assert launch.edges(ys, dy, dx, min_bytes=plans.DEFAULTS["edge_min_bytes"])
    st.launch_backward(ys, dy, dx, st.Plan("rows", block, rows=2, num_warps=1))
    assert rel_err(dx, reference_grad(x, dy)) <= SOFTMAX.tolerance[torch.float32]
    split = {**launch.params(x.device), "backward_split": {"below_rows_per_sm": 4, "programs_per_sm": 1,
                                                           "blocks": [16, 16]}}  # fmt: skip
    looped = st.Plan("looped", 16)
    for rules in (launch.params(x.device), split):  # 9 rows: one program a row; 9 < 4 x 3 "SMs": split rows
        dx = torch.full_like(x, float("nan"))
        launch.BACKWARD["looped"](ys, dy, dx, looped, rules)(ys, dy, dx)
        assert rel_err(dx, reference_grad(x, dy)) <= SOFTMAX.tolerance[torch.float32], rules["backward_split"]


@interpreter_quiet
def test_cpu_triton_rows_narrower_than_a_vector_never_take_edges() -> None:
    """Rules that would send rows narrower than a vector to the edges path (edge_min_bytes 0; the table's rules keep
    such rows out anyway): a row that ends before its first 16-byte boundary (row r of width 1-3 starts at r * width)
    is read element by element instead, since the kernels' edges assume a row reaches that boundary; right forward
    and backward (rows and looped kernels), against float64, where edges read past such a row's end."""
    rules = {**launch.params(torch.device("cpu")), "edge_min_bytes": 0}
    for width in (1, 2, 3):
        (x,) = SOFTMAX.make_inputs((9, width), torch.float32, "cpu", width)
        (dy,) = SOFTMAX.make_inputs((9, width), torch.float32, "cpu", width + 1)
        ys = torch.softmax(x, -1)
        assert not launch.edges(x, ys, dy, min_bytes=0)
        assert launch.reads(x, ys, dy, min_bytes=0) == "scalars"
        for plan in (st.Plan("rows", 4, rows=2, num_warps=1), st.Plan("looped", 16)):
            y = torch.full_like(x, float("nan"))
            launch.FORWARD[plan.kernel](x, y, plan, rules)(x, y)
            assert rel_err(y, reference(x)) <= SOFTMAX.tolerance[torch.float32], f"{plan}, width {width}"
            dx = torch.full_like(x, float("nan"))
            launch.BACKWARD[plan.kernel](ys, dy, dx, plan, rules)(ys, dy, dx)
            assert rel_err(dx, reference_grad(x, dy)) <= SOFTMAX.tolerance[torch.float32], f"{plan}, width {width}"


def test_edges_rule() -> None:
    """Edges only where rows are not whole vectors, long enough, 16-byte aligned, row strides agreeing mod a vector."""
    x = torch.empty(4, 129)
    assert launch.edges(x, torch.empty(4, 129), min_bytes=128)
    assert not launch.edges(torch.empty(4, 128), torch.empty(4, 128), min_bytes=128)  # whole vectors already
    assert not launch.edges(torch.empty(4, 31), torch.empty(4, 31), min_bytes=128)  # too short
    assert not launch.edges(torch.empty(4, 3), torch.empty(4, 3), min_bytes=0)  # narrower than a vector
    assert launch.edges(torch.empty(4, 5), torch.empty(4, 5), min_bytes=0)
    assert not launch.edges(*(torch.empty(4, 7, dtype=torch.bfloat16) for _ in "xy"), min_bytes=0)
    assert not launch.edges(torch.empty(4, 130)[:, 1:], torch.empty(4, 129), min_bytes=128)  # misaligned buffer
    assert not launch.edges(torch.empty(4, 131)[:, :129], torch.empty(4, 129), min_bytes=128)  # strides 131 vs 129
    assert launch.edges(torch.empty(4, 133)[:, :129], torch.empty(4, 129), min_bytes=128)  # 133 = 129 mod 4


def test_plan_rules_are_pure_and_take_parameters() -> None:
    """The rules without a GPU: split spans are equal, vector multiples, cover the row; a table's parameters change
    the choice for every width they govern (not one width)."""
    for width in (32769, 50257, 151936, 2**20 - 3):
        parts, span, tile = plans.split_spans(width, 16384, 16)
        assert span % 16 == 0 and span <= 16384 and parts * span >= width > (parts - 1) * span and tile >= span
    assert plans.split_spans(32769, 16384, 16) == (3, 10928, 16384)  # three equal spans, not 16384 + 16384 + 1
    p = plans.DEFAULTS
    assert plans.choose_forward(50257, 2, True, 132, p) == plans.Plan("split", 8192, 1, 8)  # odd: one by one
    assert plans.choose_forward(50258, 2, True, 132, p).kernel == "split_pairs"
    assert plans.choose_forward(50257, 2, True, None, p).kernel == "looped"  # cannot wait: looped
    assert plans.choose_forward(2**20, 4, False, 32, p).kernel == "looped"  # 64 spans > 32 SMs
    wide = {**p, "tile_bytes": {"4": 8192, "2": 4096}}
    for width in (100, 129, 200, 255):
        assert (
            plans.choose_forward(width, 4, False, 132, wide).rows
            == 2 * plans.choose_forward(width, 4, False, 132, p).rows
        )
        assert plans.choose_forward(width, 2, True, 132, wide) == plans.choose_forward(width, 2, True, 132, p)
    assert plans.choose_backward(16385, 4, p).kernel == "looped" and plans.choose_backward(16384, 4, p).kernel == "rows"


def test_small_tensors_get_fewer_rows_a_program() -> None:
    """A rows plan's tiles hold fewer rows (halved, down to 1) until the grid holds fill_warps_per_sm warps per SM:
    small tensors spread over the GPU, large ones keep the plan's tiles."""
    p = plans.DEFAULTS
    least = p["fill_warps_per_sm"] * 132
    assert plans.fill_rows(16, 1, 3694, 132, p) == 4  # 231 one-warp programs -> 924
    assert plans.fill_rows(16, 4, 3694, 132, p) == 16  # 231 programs of four warps already fill it
    assert plans.fill_rows(8, 1, 988774, 132, p) == 8 and plans.fill_rows(16, 1, 5, 132, p) == 1
    for n_rows, rows, warps in itertools.product((1, 7, 300, 1818, 6052, 10**5), (1, 2, 8, 32), (1, 4)):
        got = plans.fill_rows(rows, warps, n_rows, 132, p)
        assert got in (1, 2, 4, 8, 16, 32) and got <= rows, (n_rows, rows, warps, got)
        assert got == rows or -(-n_rows // (2 * got)) * warps < least <= -(-n_rows // got) * warps or got == 1


def test_many_rows_read_element_by_element_get_more_rows_a_program() -> None:
    """Rows read element by element in loads of two elements or more: rows per program doubled while a thread holds
    at most scalar_grow[0] values and the grid keeps scalar_grow[1] programs per SM; loads of one element, and
    scalar_grow[1] = 0 (the default), never grow."""
    p = {**plans.DEFAULTS, "scalar_grow": [16, 32]}
    assert plans.grow_rows(64, 8, 4, 2, 9_978_070, 132, plans.DEFAULTS) == 64
    assert plans.grow_rows(64, 8, 4, 2, 9_978_070, 132, p) == 256  # 2048 values on 4 warps: 16 a thread
    assert plans.grow_rows(64, 8, 4, 1, 9_978_070, 132, p) == 64  # loads of one element
    assert plans.grow_rows(64, 8, 4, 2, 250_007, 132, p) == 64  # 128 rows: 1954 programs, fewer than 32 per SM
    assert plans.grow_rows(8, 64, 1, 2, 10**7, 132, p) == 8  # 512 values on one warp: 16 a thread already
    for n_rows, rows, block, warps in itertools.product((1, 7, 5000, 10**6, 10**7), (1, 8, 64), (1, 8, 64), (1, 4)):
        got = plans.grow_rows(rows, block, warps, 4, n_rows, 132, p)
        fits = got * block <= 16 * 32 * warps and -(-n_rows // got) >= 32 * 132
        assert got >= rows and (got == rows or fits), (n_rows, rows, block, warps, got)
        assert 2 * got * block > 16 * 32 * warps or -(-n_rows // (2 * got)) < 32 * 132, (n_rows, rows, block, got)


def test_split_rows_of_few_rows_get_finer_spans() -> None:
    """A split plan's spans are halved, down to split_fill[1] columns, while the grid holds fewer than split_fill[0]
    programs per SM, and never into more spans than SMs; split_fill[0] = 0 (the default) never halves; the tuner times
    the spans the launcher makes."""
    from fuselab.ops.softmax import tune

    p = {**plans.DEFAULTS, "split_fill": [3, 4096]}
    assert plans.split_chunk(16384, 104, 36799, 132, plans.DEFAULTS) == 16384
    assert plans.split_chunk(16384, 104, 36799, 132, p) == 8192  # 312 programs -> 520 (3 per SM: 396)
    assert plans.split_chunk(16384, 591, 43468, 132, p) == 16384  # 1773 programs already
    assert plans.split_chunk(16384, 1, 2**20, 132, p) == 8192  # 128 spans; 256 would not fit at once
    assert plans.split_chunk(8192, 1, 40000, 132, p) == 4096  # down to split_fill[1] at most
    for rows, width, chunk in itertools.product((1, 7, 100, 500, 5000), (32769, 50257, 151936, 10**6), (8192, 16384)):
        got = plans.split_chunk(chunk, rows, width, 132, p)
        assert 4096 <= got <= chunk and chunk % got == 0 and -(-width // got) <= max(132, -(-width // chunk))
        assert plans.split_chunk(got, rows, width, 132, p) == got  # the launcher applies it to the tuner's plan again
    x = torch.empty(104, 36799)
    assert tune.launched_plan(x, torch.empty_like(x), p, 132).plan == plans.Plan("split", 8192, 1, 16)
    assert tune.launched_plan(x, torch.empty_like(x), plans.DEFAULTS, 132).plan == plans.Plan("split", 16384, 1, 16)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gpu_split_rows_in_finer_spans_stay_right(dtype: torch.dtype) -> None:
    """Few wide rows split finer (split_fill), one by one, in pairs (bf16 of even width), with edges (x[:, 1:]) and in
    16-byte vectors of a width no multiple of 16 (fp32 47 692, bf16 73 352 in pairs: width and strides passed divided
    by their alignment): against the reference, into NaN-poisoned outputs, with the rules that halve the spans and
    without."""
    base = launch.params(torch.device("cuda"))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    tol = SOFTMAX.tolerance[dtype]
    for (rows, width), offset in itertools.product(
        ((104, 36799), (3, 50258), (1, 151937), (40, 65536), (163, 47692), (25, 73352)), (0, 1)
    ):
        x, _ = _rows_at_offset(rows, width, offset, dtype, seed=43)
        read = launch.reads(x, x, min_bytes=base["edge_min_bytes"])
        for rules in (base, {**base, "split_fill": [6, 2048]}):
            plan = plans.choose_forward(width, x.element_size(), dtype == torch.bfloat16, sms, rules, read)
            assert plan.kernel.startswith("split"), plan
            y = torch.full_like(x, float("nan"))
            st.launch_forward(x, y, plan, rules)
            assert rel_err(y, reference(x)) <= tol, f"{plan} {rules['split_fill']} {dtype} {rows}x{width}+{offset}"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gpu_small_tensors_in_smaller_tiles_stay_right(dtype: torch.dtype) -> None:
    """Small tensors run their rows plans in tiles of fewer rows (plans.fill_rows): forward and backward against
    the reference, rows read in vectors, with edges (x[:, 1:]) and one by one, into NaN-poisoned outputs."""
    fl = torch.ops.fuselab
    tol = SOFTMAX.tolerance[dtype]
    for (rows, width), offset in itertools.product(((3694, 71), (1818, 197), (37, 53), (5, 473), (130, 64)), (0, 1)):
        x, dy = _rows_at_offset(rows, width, offset, dtype, seed=41)
        y = fl.softmax_triton(x)
        assert rel_err(y, reference(x)) <= tol, f"forward {dtype} {rows}x{width} offset {offset}"
        assert rel_err(fl.softmax_triton_backward(y, dy), _exact_backward(y, dy)) <= tol, (
            f"backward {dtype} {rows}x{width}"
        )


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gpu_many_narrow_rows_in_grown_tiles_stay_right(dtype: torch.dtype) -> None:
    """Many narrow rows read element by element run in tiles of more rows (plans.grow_rows): the forward with rules
    that grow and with the table's, into NaN-poisoned outputs, and the backward as the table has it, against the
    reference; rows loaded one element at a time (width 7) keep their tiles."""
    base = launch.params(torch.device("cuda"))
    grown = {**base, "scalar_grow": [16, 16]}
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    tol = SOFTMAX.tolerance[dtype]
    for rows, width in ((2_000_003, 6), (1_000_003, 2), (456_789, 22), (300_001, 7)):
        x, dy = _rows_at_offset(rows, width, 0, dtype, seed=47)
        read, align = launch.reads(x, x, min_bytes=base["edge_min_bytes"]), launch.alignment(x, x)
        assert read == "scalars" and align == (1 if width == 7 else 2), (read, align)
        for rules in (base, grown):
            plan = plans.choose_forward(width, x.element_size(), dtype == torch.bfloat16, sms, rules, read)
            launched = launch.rows_per_program(plan, rows, sms, rules, read, align)
            if rules is grown and width in (6, 7):
                assert (launched > plan.rows) == (width == 6), (plan, launched)
            y = torch.full_like(x, float("nan"))
            st.launch_forward(x, y, plan, rules)
            assert rel_err(y, reference(x)) <= tol, f"{plan} rows {launched} {dtype} {rows}x{width}"
        y = torch.ops.fuselab.softmax_triton(x)
        assert rel_err(torch.ops.fuselab.softmax_triton_backward(y, dy), _exact_backward(y, dy)) <= tol, (
            f"backward {dtype} {rows}x{width}"
        )


# The CUDA impl's plans (softmax_plan.h), compiled by the host's C++ compiler: the rules checked without a GPU.
CXX = shutil.which("c++") or shutil.which("g++")
CUDA_PLAN_SHIM = """
#include "softmax_plan.h"
using namespace fuselab::softmax_plan;
SpanRules rules_of(const int64_t* r) {
  return {(int)r[0], (int)r[1], (int)r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], r[10], r[11], r[12], r[13],
          r[14], r[15], r[16]};
}
extern "C" void plan(int64_t rows, int64_t width, int vec, int itemsize, int sms, int backward, const int64_t* r,
                     int64_t* out) {
  const SpanPlan p = backward ? backward_plan(rows, width, vec, itemsize, sms, rules_of(r))
                              : forward_plan(rows, width, vec, itemsize, sms, rules_of(r));
  out[0] = p.parts; out[1] = p.span; out[2] = p.threads; out[3] = p.iters;
}
extern "C" void route_of(int64_t rows, int64_t width, int itemsize, int sms, int backward, int n,
                         const int64_t* addresses, const int64_t* strides, const int64_t* r, int64_t* out) {
  const auto at = [&](int i) { return reinterpret_cast<const void*>(static_cast<uintptr_t>(addresses[i])); };
  const Route p = n == 2 ? route({at(0), at(1)}, {strides[0], strides[1]}, rows, width, itemsize, sms, false,
                                 rules_of(r))
                         : route({at(0), at(1), at(2)}, {strides[0], strides[1], strides[2]}, rows, width, itemsize,
                                 sms, backward != 0, rules_of(r));
  const ScratchElems e = scratch_elems(rows, p);
  out[0] = (int64_t)p.kernels; out[1] = p.vectorized; out[2] = p.same_phase; out[3] = p.spans.parts;
  out[4] = e.counters; out[5] = e.partials;
}
extern "C" int valid(const int64_t* r) { return valid_rules(rules_of(r)); }
extern "C" void staged(int64_t rows, int64_t width, int itemsize, int sms, int backward, const int64_t* r,
                       int64_t* out) {
  const StagedPlan p = staged_plan(rows, width, itemsize, sms, rules_of(r), backward != 0);
  out[0] = p.rows; out[1] = p.group; out[2] = p.items; out[3] = staged_smem_bytes(p, width, itemsize, backward != 0);
}
extern "C" int warp(int64_t width, int itemsize, int vectorized, int backward, const int64_t* r) {
  return warp_rows(width, itemsize, vectorized != 0, backward != 0, rules_of(r));
}
extern "C" int edge_warp(int64_t width, int itemsize, int vectorized, int same_phase, const int64_t* r) {
  return edge_warp_rows(width, itemsize, vectorized != 0, same_phase != 0, rules_of(r));
}
"""
DEFAULT_SPAN_RULES = plans.DEFAULTS["cuda_spans"]
KERNELS = ("single", "staged", "edge_warp", "warp", "spans", "looped")  # softmax_plan.h's Kernels, in order


class Route(NamedTuple):
    """softmax_plan.h's Route of a launch, and the scratch (counters, partials) it needs."""

    kernels: str
    vectorized: bool
    same_phase: bool
    parts: int
    scratch: tuple[int, int]


@pytest.fixture(scope="module")
def cuda_plans(tmp_path_factory: pytest.TempPathFactory):
    """(plan, route, valid, warp, staged, edge_warp): the CUDA plan rules as Python functions (CUDA_PLAN_SHIM), under
    the span rules `rules` (a mapping of cuda.SPAN_RULES; default: plans.DEFAULTS["cuda_spans"])."""
    if CXX is None:
        pytest.skip("no C++ compiler to build softmax_plan.h")
    folder = tmp_path_factory.mktemp("cuda_plans")
    (folder / "shim.cpp").write_text(CUDA_PLAN_SHIM)
    header_dir = Path(cuda.CU_FILE).parent
    lib = folder / "libplans.so"
    cmd = [CXX, "-std=c++17", "-O1", "-shared", "-fPIC", f"-I{header_dir}", str(folder / "shim.cpp"), "-o", str(lib)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    shim = ctypes.CDLL(str(lib))
    i64 = ctypes.c_int64

    def packed(rules: dict | None) -> ctypes.Array:
        rules = {**DEFAULT_SPAN_RULES, **(rules or {})}
        return (i64 * len(cuda.SPAN_RULES))(*(rules[name] for name in cuda.SPAN_RULES))

    def plan(rows: int, width: int, vec: int, itemsize: int, sms: int, backward: bool, rules: dict | None = None):
        out = (i64 * 4)()
        shim.plan(i64(rows), i64(width), vec, itemsize, sms, int(backward), packed(rules), out)
        return tuple(out)

    def route(
        rows: int,
        width: int,
        itemsize: int,
        backward: bool,
        rules: dict | None = None,
        sms: int = 132,
        offsets: tuple[int, ...] = (0, 0, 0),
        strides: tuple[int, ...] | None = None,
    ) -> Route:
        """The launch's route over x and y (backward: y, dy and dx) at these byte offsets from a 16-byte boundary
        (each tensor 1 MiB apart) and row strides (default: the width)."""
        n = 3 if backward else 2
        addresses = (i64 * n)(*((1 + i) * 2**20 + offsets[i] for i in range(n)))
        strides = (i64 * n)(*(strides or (width,) * n))
        out = (i64 * 6)()
        shim.route_of(i64(rows), i64(width), itemsize, sms, int(backward), n, addresses, strides, packed(rules), out)
        return Route(KERNELS[out[0]], bool(out[1]), bool(out[2]), out[3], (out[4], out[5]))

    def valid(rules: dict) -> bool:
        return bool(shim.valid(packed(rules)))

    def warp(width: int, itemsize: int, vectorized: bool, backward: bool, rules: dict | None = None) -> bool:
        return bool(shim.warp(i64(width), itemsize, int(vectorized), int(backward), packed(rules)))

    def staged(rows: int, width: int, itemsize: int, backward: bool, rules: dict | None = None, sms: int = 132):
        out = (i64 * 4)()
        shim.staged(i64(rows), i64(width), itemsize, sms, int(backward), packed(rules), out)
        return tuple(out)

    def edge_warp(width: int, itemsize: int, vectorized: bool, same_phase: bool, rules: dict | None = None) -> bool:
        return bool(shim.edge_warp(i64(width), itemsize, int(vectorized), int(same_phase), packed(rules)))

    return plan, route, valid, warp, staged, edge_warp


def wide_hold(vec: int, backward: bool) -> int:
    """Values a thread of a block past 512 threads holds at most (softmax_plan.h: what 64 registers keep unspilled;
    the backward holds 16-bit packs, 8 values each, as stored)."""
    return 8 if vec == 1 else (32 if vec == 8 else 16) if backward else 32


@pytest.mark.parametrize("threads", [512, 1024])
def test_cuda_span_plans_cover_every_row_and_fit_the_gpu(cuda_plans, threads: int) -> None:
    """Over odd and round widths, few and many rows, three SM counts, both passes, blocks of up to 512 and 1024
    threads: a row's spans are whole packs that cover it, a block holds its span within the values a thread may hold
    (fewer in blocks past 512 threads, whose kernels have 64 registers a thread: such blocks only hold rows whole,
    cut rows go to blocks of up to 512), a row's spans fit on the GPU at once (at most SMs of them), rows too wide
    for that go looped (parts 0), many rows are cut only as far as they must be, and few rows cut finer than they
    must be never take more than blocks_per_sm blocks per SM (a grid past what runs at once has a second wave wait
    out the first's meetings)."""
    plan, *_ = cuda_plans
    rules = {"threads": threads}
    for sms, backward, (itemsize, vec) in itertools.product((132, 78, 16), (False, True), ((4, 4), (2, 8), (4, 1))):
        hold = (32 if itemsize == 2 else 16) if backward else 32  # the defaults' backward_hold: 32 16-bit values
        wide = min(hold, wide_hold(vec, backward))
        whole = threads * wide if threads > 512 else 0  # a row a block of more than 512 threads holds whole
        for rows, width in itertools.product(
            (1, 2, 7, 15, 77, 131, 132, 5000), (1025, 3011, 16385, 22769, 50257, 694237, 1_048_576, 5_000_001)
        ):
            parts, span, threads_, iters = plan(rows, width, vec, itemsize, sms, backward, rules)
            least = 1 if width <= whole else -(-width // (min(threads, 512) * hold))  # spans a row needs
            if least > sms:
                assert parts == 0, (sms, backward, rows, width)  # looped
                continue
            assert 1 <= parts <= sms and parts >= least, (sms, backward, rows, width, parts)
            assert span % vec == 0 and parts * span >= width, (rows, width, parts, span)
            rounded = iters if iters <= 8 else (16 if iters <= 16 else 32)  # as the launcher instantiates them
            assert threads_ in (128, 256, 512, 1024)[: 3 + (threads > 512)], (rows, width, threads_)
            assert threads_ * iters * vec >= span, (rows, width, threads_, iters)
            assert rounded * vec <= (hold if threads_ <= 512 else wide), (rows, width, vec, threads_, iters)
            assert threads_ <= 512 or parts == 1, (rows, width, threads_, parts)
            if rows >= sms:
                assert parts == least, (sms, rows, width, parts)  # many rows: no meetings they do not need
            elif parts > least:
                assert rows * parts <= DEFAULT_SPAN_RULES["blocks_per_sm"] * sms, (sms, backward, rows, width, parts)


def test_cuda_span_plans_cut_few_long_rows_finely_and_leave_short_ones_whole(cuda_plans) -> None:
    plan, route, *_ = cuda_plans
    r512 = {"threads": 512}
    assert plan(2, 694237, 4, 4, 132, False)[0] == 132  # two rows fill the GPU: 2 x 132 blocks
    assert plan(1, 1_048_576, 4, 4, 132, False)[0] == 132  # one row: as many spans as SMs, never more (nor looped)
    assert plan(1, 256000, 4, 4, 132, False)[0] == 125  # spans of 8 KiB: 1 000 000 bytes / 8192
    assert plan(6, 5500, 4, 4, 132, False)[0] == 1  # 22 KB rows: a meeting would cost more than it saves
    assert plan(7, 11987, 8, 2, 132, False)[0] == 1
    assert plan(15, 22769, 4, 4, 132, False, r512)[0] == 11  # cut anyway (22 769 > 16 384): as finely as 8 KiB allows
    assert plan(613, 22711, 4, 4, 132, False, r512)[0] == 2  # many rows: only as far as a block's hold asks
    assert plan(87, 10984, 8, 2, 132, True, r512)[0] == 1  # the backward holds 16 384 16-bit columns a block
    assert plan(87, 10984, 4, 4, 132, True, r512)[0] == 3  # and 8 192 fp32 ones: cut anyway, as finely as 8 KiB
    # blocks of 1024 threads hold 32 values a thread in packs, 16 fp32 values of y and dy backward (32 16-bit ones),
    # 8 one by one
    r1024 = {"threads": 1024}
    assert plan(613, 22711, 4, 4, 132, False, r1024) == (1, 22712, 1024, 6)
    assert plan(1898, 18944, 8, 2, 132, False, r1024) == (1, 18944, 1024, 3)
    assert plan(3373, 11008, 4, 4, 132, True, r1024) == (1, 11008, 1024, 3)
    assert plan(613, 22711, 1, 4, 132, False, r1024) == (2, 11356, 512, 23)  # one by one: 512 threads, 32 values
    assert plan(5000, 30000, 4, 4, 132, False, r1024) == (1, 30000, 1024, 8)  # whole: 32 values a thread
    assert plan(5000, 33000, 4, 4, 132, False, r1024)[:3] == (3, 11000, 512)  # past 32 768: spans of 512
    assert plan(7, 30000, 8, 2, 132, False, r1024) == (1, 30000, 1024, 4)  # 60 KB rows are not cut
    assert plan(1898, 18944, 4, 4, 132, True, r1024)[:3] == (3, 6316, 512)  # cut anyway: blocks of 512, not 1024
    assert plan(242, 49549, 8, 2, 132, False, r1024)[:3] == (4, 12392, 512)
    assert route(6, 5500, 4, False).scratch == (0, 0)  # whole rows meet nowhere
    assert route(2, 694237, 4, False).scratch == (3, 2 * 2 * 132)  # 1 + rows counters, (max, sum) per span
    assert route(3, 1000, 4, False).scratch == (0, 0)  # warp kernel
    # rows in packs held whole by a block of 1024 need no scratch; rows read one by one (8 values a thread there) are
    # cut, and need it: the scratch is the launch's own
    assert plan(3, 20000, 4, 4, 132, False, r1024)[0] == 1 and plan(3, 20000, 1, 4, 132, False, r1024)[0] == 9
    assert route(3, 20000, 4, False, r1024) == ("spans", True, True, 1, (0, 0))
    assert route(3, 20000, 4, False, r1024, offsets=(4, 0)) == ("spans", False, False, 9, (4, 2 * 3 * 9))


def test_cuda_backward_holds_up_to_32_16_bit_values_a_thread_and_half_as_many_fp32(cuda_plans) -> None:
    """backward_hold counts 16-bit values of y and of dy a thread, up to 32 (the kernels are compiled for it), and
    fp32 rows hold half as many, the same registers (16-bit packs are held as stored). The defaults' 32: blocks of
    up to 512 threads hold 32 16-bit values a thread, as the forward's hold 32 of x (bf16 305 x 11 008: 512 threads
    x 3 packs, the forward's plan and the shape of Liger's kernel, not 1024 x 2; docs/ops/softmax.md, session 69);
    blocks of 1024 (64 registers) too, so 16-bit rows of up to 32 768 are held whole by one block (3 x 28 672: not
    7 spans that meet); fp32 rows 16 values, as before the count was in 16-bit values (fp32 rows past 512 x 16 are
    cut). 33 is refused."""
    plan, _, valid, *_ = cuda_plans
    h16 = {"backward_hold": 16}
    assert plan(305, 11008, 8, 2, 132, True) == (1, 11008, 512, 3)  # the defaults: 32 values a thread
    assert plan(305, 11008, 8, 2, 132, True, h16) == (1, 11008, 1024, 2)
    assert plan(305, 11008, 8, 2, 132, False) == (1, 11008, 512, 3)  # the forward's
    assert plan(16, 16384, 8, 2, 132, True) == (1, 16384, 512, 4)
    assert plan(200, 32768, 8, 2, 132, True) == (1, 32768, 1024, 4)  # 1024 threads x 32 16-bit values
    assert plan(3, 28672, 8, 2, 132, True) == (1, 28672, 1024, 4)  # one block a row, no meeting
    assert plan(3, 28672, 8, 2, 132, True, h16)[0] == 7  # 16 values a thread: 7 spans that meet
    assert plan(6, 11008, 4, 4, 132, True) == (1, 11008, 1024, 3)  # fp32: 16 values, 1024 threads hold it whole
    assert plan(6, 11008, 4, 4, 132, True, h16)[0] == 5  # fp32 under 16: 8 values a thread
    assert plan(200, 32768, 4, 4, 132, True) == (4, 8192, 512, 4)  # fp32: 512 threads x 16 values a span
    assert valid({**DEFAULT_SPAN_RULES, "backward_hold": 32}) and not valid({**DEFAULT_SPAN_RULES, "backward_hold": 33})


def test_cuda_one_wave_cuts_few_rows_finer_where_that_makes_the_grid_run_at_once(cuda_plans) -> None:
    """one_wave 1: few rows whose blocks would not all run at once (a second wave, mostly idle, waits out the first)
    are cut finer where smaller blocks, more of them an SM, make it one wave. fp32 112 x 33 024 (1.42-1.51x the best
    peer in the seed-2035 draw): 3 spans of 512 threads, 336 blocks where 264 run at once (2 an SM by registers), then
    9 spans of 128 threads, 1008 blocks where 1056 do. Unchanged: rows that fit one wave already, and rows no cut fits
    in one (bf16 125 x 50 086: 6.3 M values, past 132 SMs x 1024 threads x 32 values)."""
    plan, *_ = cuda_plans
    wave = {"one_wave": 1}
    assert plan(112, 33024, 4, 4, 132, False) == (3, 11008, 512, 6)
    assert plan(112, 33024, 4, 4, 132, False, wave) == (9, 3672, 128, 8)
    assert plan(125, 50086, 8, 2, 132, False, wave) == plan(125, 50086, 8, 2, 132, False)
    assert plan(2, 694237, 4, 4, 132, False, wave) == plan(2, 694237, 4, 4, 132, False)  # 264 blocks of 128: one wave
    assert plan(52, 32000, 4, 4, 132, False, wave) == plan(52, 32000, 4, 4, 132, False)  # whole rows, no meeting
    # the H200's table (which an H100 reads) has the rule on: timed on an H100, 0.71-0.78x forward at the shapes it
    # changes (docs/ops/softmax.md); at fp32 112 x 33 024 its plan is one wave too
    h200 = json.loads((Path(plans.__file__).parent / "plans" / "nvidia-h200-sm90.json").read_text())
    table = h200["params"]["cuda_spans"]
    assert table["one_wave"] == 1
    parts, _, threads, _ = plan(112, 33024, 4, 4, 132, False, table)
    assert parts > plan(112, 33024, 4, 4, 132, False, {**table, "one_wave": 0})[0]
    assert 112 * parts <= 1024 // threads * 132
    for sms, backward, (itemsize, vec) in itertools.product((132, 78, 16), (False, True), ((4, 4), (2, 8), (4, 1))):
        for rows, width in itertools.product((1, 2, 7, 15, 77, 112, 131), (16385, 22769, 33024, 50257, 694237)):
            base = plan(rows, width, vec, itemsize, sms, backward)
            parts, span, threads, iters = plan(rows, width, vec, itemsize, sms, backward, wave)
            if (parts, span, threads, iters) == base:
                continue
            rounded = iters if iters <= 8 else (16 if iters <= 16 else 32)
            per_sm = (1024 if rounded * vec <= wide_hold(vec, backward) else 512) // threads
            assert parts > base[0] and rows * parts <= per_sm * sms, (sms, backward, rows, width, parts, threads)
            assert span * itemsize >= DEFAULT_SPAN_RULES["min_span_bytes"] and parts <= sms
            assert span % vec == 0 and parts * span >= width and threads * iters * vec >= span


def test_cuda_routes_pick_the_launchers_kernels_and_scratch_only_where_spans_meet(cuda_plans) -> None:
    """softmax_plan.h's `route`, which the launchers and the scratch they ask for both follow: rows of one column
    elementwise where the rules say so; short contiguous rows of no whole number of packs staged, but not off a 16-byte
    boundary; rows off a boundary, all at one offset, to the edge warp kernels; aligned rows up to 1024 to the warp
    kernels; rows too wide for SMs' spans looped. Scratch is the launch's own: none where a block holds a row whole
    (a CUDA graph zeroes what a launch asks for at every replay), counters and partials where the rows are cut and
    meet: a backward of few wide rows, a forward whose rows, read one element at a time, a block cannot hold whole."""
    _, route, *_ = cuda_plans
    h200 = json.loads((Path(plans.__file__).parent / "plans" / "nvidia-h200-sm90.json").read_text())
    rules = h200["params"]["cuda_spans"]
    assert route(4097, 1, 4, False, {"single_column_elementwise": 1}).kernels == "single"
    assert route(4097, 1, 4, True, {"single_column_elementwise": 0}).kernels == "warp"
    assert route(100_000, 25, 4, False).kernels == "staged"  # 100 bytes a row: the defaults stage up to 128
    assert route(100_000, 25, 4, False, offsets=(4, 4)).kernels == "warp"  # off a boundary: not staged
    edges = route(1000, 301, 4, True, {"edge_warp_row_bytes": 4096}, offsets=(4, 4, 4))
    assert edges[:3] == ("edge_warp", False, True) and edges.scratch == (0, 0)
    assert route(1000, 1000, 4, False)[:2] == ("warp", True)
    assert route(1000, 5_000_001, 4, False) == ("looped", False, True, 0, (0, 0))  # no whole packs: one by one
    assert route(1000, 5_000_000, 2, True)[:4] == ("looped", True, True, 0)
    # few wide rows under the H200's rules: a 1024-thread block holds 29 x 28 672 bf16 rows whole (no scratch);
    # its backward too (32 16-bit values a thread); fp32's (16 values a thread) is cut into 5 spans (264 // 52), which
    # meet
    assert route(29, 28672, 2, False, rules) == ("spans", True, True, 1, (0, 0))
    assert route(52, 32000, 2, False, rules).scratch == (0, 0)
    assert route(52, 32000, 4, False, rules) == ("spans", True, True, 1, (0, 0))  # fp32: 32 values a thread, whole
    assert route(52, 32000, 2, True, rules) == ("spans", True, True, 1, (0, 0))
    assert route(52, 32000, 4, True, rules) == ("spans", True, True, 5, (53, 2 * 52 * 5))
    assert route(102, 11008, 2, True, rules) == ("spans", True, True, 1, (0, 0))
    # x two bytes off a boundary, y on one: read one by one, 8 values a thread, so cut, with scratch
    scalar = route(29, 28672, 2, False, rules, offsets=(2, 0))
    assert scalar[:3] == ("spans", False, False) and scalar.parts > 1
    assert scalar.scratch == (30, 2 * 29 * scalar.parts)


def test_the_capture_cases_fill_where_the_cuda_plans_cut_rows(cuda_plans) -> None:
    """The CUDA cases of the GPU capture test (CAPTURE_CASES) expect a fill exactly where the plan cuts their rows
    into spans that meet (counters in the launch's scratch), under the defaults and under the H200's table (which an
    H100 reads), so that a change of the rules that moves a case across is caught here, not only on the GPU."""
    _, route, *_ = cuda_plans
    h200 = json.loads((Path(plans.__file__).parent / "plans" / "nvidia-h200-sm90.json").read_text())
    cases = [case for case in CAPTURE_CASES if case[0] == "cuda"]
    assert {fills for *_, fills, _ in cases} == {0, 1}
    for rules in (None, h200["params"]["cuda_spans"]):
        for _, backward, (rows, width), dtype, fills, _ in cases:
            counters = route(rows, width, dtype.itemsize, backward, rules).scratch[0]
            assert (counters > 0) == (fills == 1), (rules is None, backward, rows, width, dtype, counters)


def test_cuda_span_rules_are_plan_table_data_and_out_of_limit_rules_are_refused(cuda_plans) -> None:
    """The span rules come from the plan table (plans.DEFAULTS["cuda_spans"], one value per name the binding takes),
    and other rules give other plans: smaller blocks cut rows into more spans, a lower split threshold cuts rows of
    22 KB that the defaults leave whole. Rules beyond what the kernels are compiled for (blocks over 1024 threads or
    not a power of 2, holds over 32 forward or 16 backward, warp kernels past 1024 columns) are refused by the
    header's check, which the binding applies."""
    plan, route, valid, warp, *_ = cuda_plans
    assert set(DEFAULT_SPAN_RULES) == set(cuda.SPAN_RULES) and valid(DEFAULT_SPAN_RULES)
    assert set(SMALL_SPAN_RULES) == set(cuda.SPAN_RULES) and valid(SMALL_SPAN_RULES)  # the GPU test's, given whole
    tables = sorted((plans.FOLDER / "plans").glob("*.json"))  # a GPU's table replaces the defaults' rules whole
    assert tables
    for table in tables:
        rules = json.loads(table.read_text())["params"].get("cuda_spans", DEFAULT_SPAN_RULES)
        assert set(rules) == set(cuda.SPAN_RULES) and valid(rules), table.name
    assert plan(613, 22711, 4, 4, 132, False, {"threads": 256})[0] == 3  # 256 x 32 values a block: 3 spans
    assert plan(6, 5500, 4, 4, 132, False, {"split_row_bytes": 16384}) == (2, 2752, 128, 6)
    assert route(6, 5500, 4, False, {"split_row_bytes": 16384}).scratch == (7, 2 * 6 * 2)
    assert plan(2, 694237, 4, 4, 132, False, {"blocks_per_sm": 1})[0] == 66  # two rows on one block per SM
    for bad in ({"threads": 2048}, {"threads": 384}, {"threads": 64}, {"hold": 33}, {"backward_hold": 33},
                {"hold": 0}, {"min_span_bytes": 8}, {"blocks_per_sm": 0}, {"scalar_warp_width_fp32": 0},
                {"scalar_warp_width_16bit": 1025}, {"staged_row_bytes_fp32": -1}, {"staged_row_bytes_16bit": 2049},
                {"staged_tile_bytes": 255}, {"staged_tile_bytes": 16385},
                {"staged_packed_row_bytes": 2049}, {"edge_warp_row_bytes": -1},
                {"edge_warp_row_bytes": 4097}, {"single_column_elementwise": 2}, {"one_wave": 2},
                {"staged_lane_columns": -1}, {"staged_lane_columns": 17}):  # fmt: skip
        assert not valid({**DEFAULT_SPAN_RULES, **bad}), bad
    # rows read one element at a time leave the warp kernels past the scalar warp width of their element size (the
    # defaults: 1024 fp32, 512 16-bit); rows read in packs do not
    assert warp(945, 4, False, False) and not warp(945, 2, False, False) and warp(512, 2, False, False)
    assert warp(945, 2, True, False) and not warp(1025, 4, True, False) and not warp(600, 4, True, True)
    assert not warp(945, 4, False, False, {"scalar_warp_width_fp32": 900})
    assert not warp(400, 2, False, True, {"scalar_warp_width_16bit": 256})
    # Python's limits (cuda.refusal, checked before the binding is called) are the header's
    rng = random.Random(5)
    values = (-1, 0, 1, 8, 16, 17, 32, 33, 64, 128, 255, 256, 384, 512, 1024, 1025, 2048, 2049, 16384, 16385)
    for _ in range(300):
        rules = {**DEFAULT_SPAN_RULES, **{name: rng.choice(values) for name in rng.sample(cuda.SPAN_RULES, 2)}}
        assert valid(rules) == (cuda.refusal(rules) is None), rules
    assert "threads 2048 (128..1024)" in cuda.refusal({**DEFAULT_SPAN_RULES, "threads": 2048})
    assert "threads 384 (a power of 2)" in cuda.refusal({**DEFAULT_SPAN_RULES, "threads": 384})
    with pytest.raises(ValueError, match=r"missing \['blocks_per_sm'\], unknown \['block'\]"):
        cuda.configure(0, {**{k: v for k, v in DEFAULT_SPAN_RULES.items() if k != "blocks_per_sm"}, "block": 1})


def test_cuda_edge_warp_rows_are_misaligned_rows_of_one_phase_up_to_the_rule(cuda_plans) -> None:
    """The edge warp kernels take rows not read in packs whose tensors share a phase, from 512 bytes (a 16-byte pack
    a lane) up to edge_warp_row_bytes and 1024 columns (a lane's packs within what the kernels are compiled for);
    never rows read in packs, nor rows whose tensors start at different offsets from a 16-byte boundary; none under
    the default 0."""
    *_, edge_warp = cuda_plans
    on = {"edge_warp_row_bytes": 2048}
    assert edge_warp(532, 2, False, True, on) and edge_warp(1024, 2, False, True, on)
    assert edge_warp(129, 4, False, True, on)
    assert not edge_warp(127, 4, False, True, on) and not edge_warp(255, 2, False, True, on)  # under 512 bytes
    assert not edge_warp(1, 4, False, True, on) and not edge_warp(3, 2, False, True, on)
    assert not edge_warp(1025, 2, False, True, {"edge_warp_row_bytes": 4096})  # past kWarpMaxWidth
    assert not edge_warp(513, 4, False, True, on)  # 2052 bytes
    assert not edge_warp(532, 2, True, True, on) and not edge_warp(532, 2, False, False, on)
    assert not edge_warp(532, 2, False, True) and DEFAULT_SPAN_RULES["edge_warp_row_bytes"] == 0


def test_cuda_staged_plans_take_short_rows_of_no_whole_pack_within_the_shared_memory_they_may_use(cuda_plans) -> None:
    """Rows of no whole number of 16-byte packs, up to staged_row_bytes_fp32 / _16bit, are staged: a block's rows are
    a multiple of 8 (so each block starts on a 16-byte boundary), enough for every thread (kStagedThreads 256), about
    staged_tile_bytes of each tensor, fewer for a tensor of few rows (about staged_blocks_per_sm blocks per SM); a
    group of up to 32 threads a row, at most 4 values a thread below a warp. Rows of whole packs (the warp kernels read
    those in packs) unless staged_packed_row_bytes says, longer rows, tensors of fewer rows than a block has groups,
    and every row under a row limit of 0 are not staged. The shared memory a block takes stays within 32 KiB forward
    and 64 KiB backward (what the launcher allows)."""
    *_, staged, _ = cuda_plans
    many, wide = 10**7, {"staged_row_bytes_fp32": 2048, "staged_row_bytes_16bit": 2048}
    assert staged(many, 12, 2, False) == (344, 4, 4, 344 * 24)  # 8192 / 24 = 341 rows, up to a multiple of 8
    assert staged(many, 5, 4, True) == (416, 2, 4, 2 * 416 * 20)
    assert staged(many, 1, 2, False) == (4096, 1, 1, 8192)
    assert staged(many, 577, 2, False, wide) == (8, 32, 32, 8 * 1154)  # 7 rows of 1154 bytes in 8 KiB; 8 for 256
    assert staged(many, 101, 4, False, wide) == (24, 32, 4, 24 * 404)
    # the defaults' limits: fp32 rows up to 128 bytes, 16-bit up to 768
    assert staged(many, 31, 4, False)[0] and not staged(many, 33, 4, False)[0] and not staged(many, 101, 4, False)[0]
    assert staged(many, 383, 2, False)[0] and not staged(many, 385, 2, False)[0]
    assert staged(100003, 7, 2, False)[:2] == (192, 2)  # 100 003 rows / (132 SMs x 4): 190, not 8192 / 14 = 585
    assert staged(22470, 53, 2, False)[:2] == (48, 16)  # 43 rows a block; 16 at least (256 threads, 16 a row)
    assert staged(100003, 7, 2, False, {"staged_blocks_per_sm": 1})[0] == 592  # 758 a block would fill: 8 KiB
    # tensors too small for 4 blocks per SM of a block's groups: 64 rows of 11 (groups of 4) a block, 132 x 4 blocks
    assert staged(3, 11, 4, False) == (0, 0, 0, 0) and staged(1000, 7, 2, False)[0] == 0
    assert staged(9001, 31, 4, False)[0] == 0 and staged(132 * 4 * 64, 11, 4, False)[0] == 64
    for width, itemsize in ((8, 2), (4, 4), (100, 4), (1024, 2), (1025, 2), (513, 4)):  # whole packs, or too long
        assert staged(many, width, itemsize, False, wide)[0] == 0, (width, itemsize)
    assert staged(many, 12, 2, False, {"staged_row_bytes_16bit": 0}) == (0, 0, 0, 0)
    assert staged(many, 13, 4, False, {"staged_row_bytes_16bit": 0})[0] == 160  # fp32 rows: their own limit
    assert staged(many, 8, 2, False, {"staged_packed_row_bytes": 16}) == (512, 2, 4, 8192)  # whole packs, when asked
    assert staged(many, 12, 2, False, {"staged_packed_row_bytes": 2048, "staged_row_bytes_16bit": 0})[0] == 0
    # staged_lane_columns (forward only): a row of 10 fp32 on one lane holding 16 values, a block of 256 rows (one a
    # thread); rows wider than the rule, and the backward, in groups as before
    lanes = {"staged_lane_columns": 16}
    assert staged(many, 10, 4, False, lanes) == (256, 1, 16, 256 * 40)
    assert staged(many, 10, 4, False, {"staged_lane_columns": 8}) == (208, 4, 4, 208 * 40)
    assert staged(many, 6, 2, False, {"staged_lane_columns": 8}) == (688, 1, 8, 688 * 12)
    assert staged(many, 10, 4, True, lanes) == staged(many, 10, 4, True) == (208, 4, 4, 2 * 208 * 40)
    assert staged(many, 17, 4, False, lanes) == staged(many, 17, 4, False)
    for itemsize, tile, backward, rows in itertools.product((2, 4), (256, 8192, 16384), (False, True), (999, many)):
        for width in range(1, 2048 // itemsize + 1):
            rules = {**wide, "staged_tile_bytes": tile, "staged_packed_row_bytes": 2048 if tile == 256 else 0}
            block, group, items, smem = staged(rows, width, itemsize, backward, rules)
            least = 256 // min(32, next_power_of_2(-(-width // 4)))  # rows of a block's groups
            if (width * itemsize % 16 == 0 and tile != 256) or -(-rows // (132 * 4)) < least:
                assert block == 0, (rows, width, itemsize)
                continue
            case = (rows, width, itemsize, tile, block, group, items)
            assert block % 8 == 0 and block * group >= 256 and group in (1, 2, 4, 8, 16, 32), case
            assert (group == 32 or width <= 4 * group) and (group == 1 or width > 2 * group), case
            assert group * items >= width and (items == 1 or group * items < 2 * width), case
            assert items <= (4 if group < 32 else 32), case
            assert (block - 8) * width * itemsize < max(tile, 256 // group * width * itemsize), case
            if rows == many:
                assert block * width * itemsize >= min(tile, width * itemsize), case
            assert smem <= (2 if backward else 1) * 32768, case
