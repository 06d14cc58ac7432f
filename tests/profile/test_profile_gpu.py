"""On the GPU: real Kineto traces read right (kernels linked to operators, syncs found), run-ahead shows, and
inspect reads Triton's JIT cache. Selected with `pytest -m gpu`; skipped without a GPU."""

import pytest
import torch

import fuselab.profile as fp
from fuselab.profile.cases import get_case
from fuselab.profile.inspect import inspect_impl
from fuselab.profile.runahead import MLPConfig, run_runahead
from fuselab.profile.trace import DTOH

pytestmark = pytest.mark.gpu


def test_kernels_are_linked_to_their_operators(tmp_path):
    result = fp.profile_callable(get_case("gelu_add").make("cuda"), label="gelu_add", iters=3, out_dir=tmp_path)
    trace = result.trace
    assert trace.has_gpu and len(trace.launches()) == len(trace.gpu)  # every GPU event has its launch
    rows = {op.name: op for op in fp.build_table(trace).ops}
    for name in ("aten::add", "aten::gelu"):
        assert rows[name].calls == 3 and rows[name].gpu_us > 0
        (kernel,) = rows[name].kernels
        assert kernel.calls == 3 and kernel.kind == "kernel"
    assert any(lane.kind == "gpu" for lane in trace.lanes())
    assert fp.render_timeline(trace, tmp_path / "t.png").stat().st_size > 10_000


def test_item_is_a_device_to_host_copy_and_a_sync(tmp_path):
    x = torch.randn(1 << 20, device="cuda")
    trace = fp.profile_callable(lambda: x.sum().item(), label="item", iters=2, out_dir=tmp_path).trace
    kinds = [s.kind for s in trace.syncs()]
    assert kinds.count(DTOH) == 2
    assert any(k in kinds for k in ("cudaStreamSynchronize", "cudaDeviceSynchronize"))


def test_the_cpu_runs_ahead_until_a_print_syncs(tmp_path):
    study = run_runahead(MLPConfig(steps=8, layers=4, dim=4096, batch=4096), tmp_path)
    plain, printed = study.runs
    assert plain.analysis.has_gpu and plain.analysis.steps_ahead_max >= 2
    assert printed.analysis.steps_ahead_max == 0
    assert study.added_syncs.get("cudaStreamSynchronize", 0) >= 8 and study.added_syncs.get(DTOH, 0) >= 8


def test_inspect_reads_the_triton_jit_cache():
    result = inspect_impl("gelu", "triton", dtype=torch.float32, shape="2^20")
    assert result.kernels and "JIT cache" in result.kernels[0].origin
    k = result.kernels[0]
    assert k.ptx and k.loads[0].bytes == 16 and k.resources.registers
