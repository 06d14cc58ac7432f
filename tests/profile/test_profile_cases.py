"""The lecture's cases run on the CPU, and profile into the operators they are made of."""

import pytest
import torch

import fuselab.profile as fp
from fuselab.profile.cases import CASES, get_case
from fuselab.profile.table import build_table

EXPECTED_OP = {
    "add": "aten::add",
    "matmul2048": "aten::matmul",
    "matmul128": "aten::matmul",
    "cdist": "aten::cdist",
    "gelu_add": "aten::gelu",
    "softmax_add": "aten::softmax",
    "mlp": "aten::linear",
}


def test_every_case_is_listed():
    assert set(CASES) == set(EXPECTED_OP)
    with pytest.raises(ValueError, match="known cases: add"):
        get_case("conv")


@pytest.mark.parametrize("name", sorted(EXPECTED_OP))
def test_case_profiles_into_its_operators(name, tmp_path):
    fn = get_case(name).make("cpu")
    out = fn()
    assert isinstance(out, torch.Tensor) and torch.isfinite(out).all()
    result = fp.profile_callable(fn, label=name, warmup=0, iters=1, out_dir=tmp_path, cuda=False)
    ops = {op.name for op in build_table(result.trace).ops}
    assert EXPECTED_OP[name] in ops
