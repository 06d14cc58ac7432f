"""Selection: what a check or bench runs, the op's defaults filled in one place."""

import pytest
import torch

from fuselab.evaluate import BENCH_DTYPES, Selection
from fuselab.ops import get_op
from fuselab.ops.registry import Op, UnknownName


def test_what_is_left_out_is_the_ops_own_and_what_is_given_is_kept_typed():
    op = get_op("gelu")
    chosen = Selection(impls=["torch"], dtypes=["bf16"], shapes=[[4096]], device="cpu")
    assert chosen.impls == ("torch",) and chosen.dtypes == (torch.bfloat16,) and chosen.shapes == ((4096,),)
    assert chosen.resolved(op, "bench") == chosen  # nothing left to fill
    check, bench = Selection(device="cpu").resolved(op, "check"), Selection(device="cpu").resolved(op, "bench")
    assert check.impls == bench.impls == tuple(op.impls)
    assert check.dtypes == op.dtypes and bench.dtypes == BENCH_DTYPES
    assert check.shapes == tuple(op.defaults.check_shapes) and bench.shapes == tuple(op.defaults.bench_shapes)
    assert check.options is None and check.layouts == ("contiguous",)
    assert Selection().device == ("cuda" if torch.cuda.is_available() else "cpu")


def test_unknown_impls_and_undeclared_dtypes_are_refused_naming_what_is_known():
    op = get_op("gelu")
    with pytest.raises(UnknownName, match=r"no impl 'nope'; known: .*torch"):
        Selection(impls=["nope"]).resolved(op, "check")
    with pytest.raises(UnknownName, match="no impl 'nope'"):
        Selection(impls=["torch", "nope"]).checked(op)
    fp32_only = Op("fp32_only", lambda x: x, lambda *a: (), lambda *a: 0, lambda *a: 0, {}, dtypes=(torch.float32,))
    assert Selection(dtypes=["fp32"]).checked(fp32_only).dtypes == (torch.float32,)
    with pytest.raises(ValueError, match="fp32_only does not take bfloat16; accepted: float32"):
        Selection(dtypes=[torch.bfloat16]).checked(fp32_only)
    with pytest.raises(ValueError, match="unknown dtype"):
        Selection(dtypes=["int8"])
    with pytest.raises(ValueError, match="unknown purpose 'tune'"):
        Selection().resolved(op, "tune")


def test_layouts_are_kept_once_each_in_order_and_unknown_ones_refused_naming_the_known():
    assert Selection(layouts="sliced").layouts == ("sliced",)
    assert Selection(layouts=["sliced", "contiguous", "sliced"]).layouts == ("sliced", "contiguous")
    with pytest.raises(ValueError, match=r"unknown layout \['diagonal'\]; accepted: contiguous, transposed"):
        Selection(layouts=["contiguous", "diagonal"])
    with pytest.raises(ValueError, match="unknown layout"):
        Selection(layouts=[])
