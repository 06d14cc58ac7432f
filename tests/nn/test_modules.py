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
    assert f"impl='auto' ({op.defaults.baseline} on cpu, {on_cuda} on cuda" in repr(module)
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


def _traced_graph(model: torch.nn.Module, x: torch.Tensor) -> tuple[torch.fx.GraphModule, torch.Tensor]:
    """The graph torch.compile(fullgraph=True) captures of `model` (Dynamo's, no Inductor), and its output on x."""
    graphs = []

    def capture(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    out = torch.compile(model, backend=capture, fullgraph=True)(x)
    torch._dynamo.reset()
    assert len(graphs) == 1
    return graphs[0], out


def _targets(gm: torch.fx.GraphModule) -> list[str]:
    return [str(getattr(n.target, "__name__", n.target)) for n in gm.graph.nodes if n.op == "call_function"]


def test_under_torch_compile_the_default_gelu_hands_the_built_in_to_the_compiler_at_every_size():
    """fuselab.nn.GELU() (impl="auto") while torch.compile traces it, small or large: F.gelu, no fuselab op, so
    Inductor sees torch.nn.GELU's graph and fuses it alike; its values are the float64 formula's. A named impl is
    traced as it runs eager (the GPU test below tells the two apart). The repr says so."""
    gelu = get_op("gelu")
    model = torch.nn.Sequential(torch.nn.Linear(24, 37), fuselab.nn.GELU(approximate="tanh"))
    x = torch.randn(5, 24, generator=torch.Generator().manual_seed(4))
    gm, out = _traced_graph(model, x)
    targets = _targets(gm)
    assert "gelu" in targets and not any("fuselab" in t for t in targets), targets
    reference_gm, _ = _traced_graph(torch.nn.Sequential(model[0], torch.nn.GELU(approximate="tanh")), x)
    # beside torch.nn's graph only the drop-in's read of x.is_cpu, unused (Inductor drops it)
    assert [t for t in targets if t != "getattr"] == _targets(reference_gm), (targets, _targets(reference_gm))
    h = model[0](x).double()
    torch.testing.assert_close(out, gelu.reference(h, approximate="tanh").float(), rtol=1e-5, atol=1e-6)
    assert repr(model[1]).endswith("torch under torch.compile))"), repr(model[1])

    big = torch.randn(2**20 + 3, generator=torch.Generator().manual_seed(5))
    big_gm, big_out = _traced_graph(fuselab.nn.GELU(approximate="tanh"), big)
    assert "gelu" in _targets(big_gm) and not any("fuselab" in t for t in _targets(big_gm)), _targets(big_gm)
    torch.testing.assert_close(big_out, torch.nn.functional.gelu(big, approximate="tanh"), rtol=0, atol=0)

    named = torch.nn.Sequential(model[0], fuselab.nn.GELU(approximate="tanh", impl="compile"))
    named_gm, named_out = _traced_graph(named, x)
    assert "tanh" in _targets(named_gm) and "gelu" not in _targets(named_gm)  # the formula, as impl "compile" is
    torch.testing.assert_close(named_out, out, rtol=1e-5, atol=1e-6)
    assert "torch.compile" not in repr(named[1])


def test_a_drop_in_without_a_traced_impl_runs_its_native_impl_under_torch_compile():
    """Softmax declares no traced_impl: compiled, the default runs what it runs eager (torch.softmax on the CPU)."""
    assert get_op("softmax").traced_impl is None
    assert get_op("softmax").drop_in("auto").traced is None
    gm, out = _traced_graph(fuselab.nn.Softmax(dim=-1), torch.randn(3, 11, generator=torch.Generator().manual_seed(5)))
    assert any("softmax" in t for t in _targets(gm)), _targets(gm)
    assert out.shape == (3, 11)


@pytest.mark.gpu
def test_gpu_the_default_gelu_is_fused_by_inductor_and_a_named_one_runs_its_kernel():
    """On the GPU under Inductor: fuselab.nn.GELU() becomes part of Inductor's own kernels at any size (no fuselab op
    or kernel in the generated code) and matches the float64 formula; for impl="triton" the generated code launches
    fuselab's kernel."""
    from torch._inductor.utils import run_and_get_code

    gelu = get_op("gelu")
    torch.manual_seed(6)
    lin = torch.nn.Linear(96, 1001).cuda()
    small, large = torch.randn(7, 96, device="cuda"), torch.randn(1100, 96, device="cuda")  # 7 007 / 1 101 100
    for impl, x, expect in (
        ("auto", small, None),
        ("triton", small, "gelu_forward_kernel"),
        ("auto", large, None),
        ("triton", large, "gelu_forward_kernel"),
    ):
        torch._dynamo.reset()
        model = torch.compile(torch.nn.Sequential(lin, fuselab.nn.GELU(approximate="tanh", impl=impl)))
        with torch.no_grad():
            out, codes = run_and_get_code(model, x)
            ref = gelu.reference(lin(x).double(), approximate="tanh")
        code = "\n".join(codes)
        if expect is None:
            assert "fuselab" not in code and "gelu_forward_kernel" not in code
        else:
            assert expect in code
        torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    torch._dynamo.reset()


@pytest.mark.gpu
def test_gpu_a_compiled_feed_forward_block_at_one_token_launches_what_torch_nn_launches():
    """A feed-forward block (Linear(1024, 4096), GELU tanh, Linear(4096, 1024), bf16, one token) under
    max-autotune-no-cudagraphs: with fuselab.nn.GELU() Inductor launches the same kernels as with torch.nn.GELU (on
    an H100 two matmul templates, the bias and GELU in the first one's epilogue), not one more; the formula in
    PyTorch ops took three there (docs/call-cost.md). Its output matches torch.nn's block's (to bf16's rounding: the
    two compiles may autotune apart)."""
    import re

    from torch._inductor.utils import run_and_get_code

    torch.manual_seed(7)
    block = torch.nn.Sequential(
        torch.nn.Linear(1024, 4096), torch.nn.GELU(approximate="tanh"), torch.nn.Linear(4096, 1024)
    ).to("cuda", torch.bfloat16)
    ours = torch.nn.Sequential(block[0], fuselab.nn.GELU(approximate="tanh"), block[2])
    x = torch.randn(1, 1024, device="cuda", dtype=torch.bfloat16)
    launched, outs = {}, {}
    for name, model in (("torch.nn", block), ("fuselab", ours)):
        torch._dynamo.reset()
        with torch.no_grad():
            outs[name], codes = run_and_get_code(torch.compile(model, mode="max-autotune-no-cudagraphs"), x)
        launched[name] = sorted(re.findall(r"\b(triton_\w+?)(?:_\d+)?\.run\(", "\n".join(codes)))
    torch._dynamo.reset()
    assert launched["fuselab"] == launched["torch.nn"] and launched["torch.nn"], launched  # a cuBLAS mm is no launch
    torch.testing.assert_close(outs["fuselab"], outs["torch.nn"], rtol=2e-2, atol=2e-2)
