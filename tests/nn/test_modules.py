"""fuselab.nn's drop-in modules as a user meets them: the default fits the device, the repr says what runs, and an
impl that runs interpreted says so once."""

import warnings

import pytest
import torch

import fuselab.nn
from fuselab.ops import get_op, registry

MODULES = sorted(fuselab.nn.modules())  # GELU, Softmax: every op that declares one


def op_of(name: str):
    return next(op for op in (get_op("gelu"), get_op("softmax")) if op.module.__name__ == name)


@pytest.mark.parametrize("name", MODULES)
def test_the_default_runs_the_native_impl_of_the_tensors_device_and_says_which(name):
    """impl="auto" (the default): the op's built-in on the CPU (Triton only interprets there), fuselab's fused
    kernel on a GPU; the repr names both, and on the CPU the output is the built-in's, bit for bit, with no warning."""
    op, cls = op_of(name), fuselab.nn.modules()[name]
    module, builtin = cls.drop_in_pair("auto")
    on_cuda = op.native_impl("cuda")
    assert op.native_impl("cpu") == op.defaults.baseline
    if torch.cuda.is_available():
        assert op.get_impl(on_cuda).triton_kernels is not None or op.get_impl(on_cuda).cuda_source is not None
    assert f"impl='auto' ({op.defaults.baseline} on cpu, {on_cuda} on cuda)" in repr(module)
    x = torch.randn(8, 37, generator=torch.Generator().manual_seed(1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.testing.assert_close(module(x), builtin(x), rtol=0, atol=0)


@pytest.mark.parametrize("name", MODULES)
def test_an_impl_named_that_runs_interpreted_warns_once_a_process_at_the_users_line(name, monkeypatch):
    """impl="triton" on the CPU runs under Triton's interpreter: the first call of any such module warns (naming
    impl='auto'), pointing at the caller's line, not torch's; the other modules and calls stay quiet."""
    op, cls = op_of(name), fuselab.nn.modules()[name]
    monkeypatch.setattr(registry, "_WARNED", set(), raising=False)  # as in a fresh process
    first, second = cls.drop_in_pair("triton")[0], cls.drop_in_pair("triton")[0]
    x = torch.randn(2, 16, generator=torch.Generator().manual_seed(2))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # Python's own once-per-location filter does not hide a second warning
        first(x)
        first(x)
        second(x)
    interpreted = [w for w in caught if "Triton's interpreter" in str(w.message)]
    assert len(interpreted) == 1, [str(w.message) for w in interpreted]
    assert f"{op.name} impl 'triton'" in str(interpreted[0].message) and "impl='auto'" in str(interpreted[0].message)
    assert interpreted[0].filename == __file__
