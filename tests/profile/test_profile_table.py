"""Kernel tables: from a real CPU profile, from the handmade GPU-like trace, kernel-name shortening."""

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import fuselab.profile as fp
from fuselab.profile.table import NO_OP, build_table, format_us, short_kernel_name
from fuselab.profile.trace import Trace

DATA = Path(__file__).resolve().parents[1] / "data" / "profile"


def test_table_of_a_cpu_profile(tmp_path):
    a, b = torch.randn(200, 300), torch.randn(300, 100)

    def fn() -> torch.Tensor:
        return F.gelu(a @ b + 1.0)

    result = fp.profile_callable(fn, label="fn", warmup=1, iters=3, out_dir=tmp_path, cuda=False)
    table = build_table(result.trace, title="fn")
    rows = {op.name: op for op in table.ops}
    assert {"aten::matmul", "aten::add", "aten::gelu"} <= set(rows)
    assert "aten::mm" not in rows  # called from aten::matmul: part of its row, not a row of its own
    for name in ("aten::matmul", "aten::add", "aten::gelu"):
        assert rows[name].calls == 3 and rows[name].cpu_us > 0 and rows[name].kernels == []
    assert not table.has_gpu and table.gpu_total_us == 0
    assert table.cpu_total_us == pytest.approx(sum(op.cpu_us for op in table.ops))
    assert sum(table.share(op) for op in table.ops) == pytest.approx(1.0)
    by_cpu = [op.cpu_us for op in table.ops]
    assert by_cpu == sorted(by_cpu, reverse=True)  # default order on the CPU: CPU time
    assert [op.name for op in table.sorted("name").ops] == sorted(rows)
    text = table.to_text()
    assert "aten::matmul" in text and "CPU total" in text and "GPU total" not in text.split("\n")[2]
    (rng,) = table.ranges  # the range profile_callable put around each call
    assert (rng.name, rng.calls) == ("fn", 3) and rng.cpu_us >= table.cpu_total_us
    assert "ranges" in text
    data = json.loads(json.dumps(table.to_json()))
    assert data["has_gpu"] is False and len(data["ops"]) == len(table.ops) and data["ranges"][0]["name"] == "fn"
    with pytest.raises(ValueError, match="accepted: gpu, cpu"):
        table.sorted("speed")


def test_table_of_the_gpu_like_trace_attributes_kernels_to_operators():
    table = build_table(Trace.load(DATA / "runahead_gpu_like_print.json"))
    assert table.has_gpu
    assert [op.name for op in table.ops] == ["aten::mm", "aten::item"]  # by GPU time
    mm, item = table.ops
    assert mm.calls == 9 and mm.gpu_us == pytest.approx(9 * 150.0) and mm.gpu_avg_us == pytest.approx(150.0)
    (kernel,) = mm.kernels
    assert kernel.name == "vectorized_elementwise_kernel<CUDAFunctor_add>"
    assert kernel.full_name.startswith("void at::native::vectorized_elementwise_kernel<4,")
    assert kernel.calls == 9 and kernel.launched_by == ["aten::mm"]
    (copy,) = item.kernels
    assert copy.kind == "memcpy" and copy.calls == 3 and copy.launched_by == ["aten::_local_scalar_dense"]
    assert table.gpu_total_us == pytest.approx(9 * 150.0 + 3 * 2.0)
    assert table.share(mm) + table.share(item) == pytest.approx(1.0)
    assert [(r.name, r.calls) for r in table.ranges] == [("step 0", 1), ("step 1", 1), ("step 2", 1)]
    assert [r.gpu_us for r in table.ranges] == pytest.approx([452.0] * 3)  # 3 kernels + the copy, back to back
    text = table.to_text()
    assert "└ vectorized_elementwise_kernel<CUDAFunctor_add>" in text and "GPU avg" in text and "GPU span" in text
    assert "void at::native" in table.to_text(full_names=True)


def _event(cat, name, ts, dur, pid=1, tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": pid, "tid": tid, "args": args}


def test_kernels_launched_outside_operators_belong_to_their_range():
    events = [
        _event("user_annotation", "gelu.triton", 0.0, 50.0),
        _event("cuda_driver", "cuLaunchKernelEx", 10.0, 5.0, correlation=7),
        _event("kernel", "gelu_kernel", 20.0, 30.0, pid=0, tid=7, correlation=7),
        _event("cuda_runtime", "cudaLaunchKernel", 60.0, 5.0, correlation=8),  # outside everything
        _event("kernel", "orphan_kernel", 70.0, 4.0, pid=0, tid=7, correlation=8),
    ]
    table = build_table(Trace.from_json({"traceEvents": events}))
    rows = {op.name: op for op in table.ops}
    assert rows["gelu.triton"].kind == "range" and rows["gelu.triton"].calls == 1
    assert rows["gelu.triton"].kernels[0].name == "gelu_kernel" and rows["gelu.triton"].gpu_us == 30.0
    assert rows[NO_OP].kernels[0].name == "orphan_kernel"


@pytest.mark.parametrize(
    ("full", "short"),
    [
        (
            "void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::GeluCUDAKernelImpl("
            "at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda(float)#1}, "
            "std::array<char*, 2ul> >(int, std::array<char*, 2ul>)",
            "vectorized_elementwise_kernel<GeluCUDAKernelImpl>",
        ),
        (
            "void (anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, (anonymous namespace)::"
            "SoftMaxForwardEpilogue>(float*, float const*, int)",
            "cunn_SoftMaxForward<SoftMaxForwardEpilogue>",
        ),
        (
            "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float, "
            "at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>"
            ", unsigned int, float, 4, 4> >(at::native::ReduceOp<float, unsigned int, float, 4, 4>)",
            "reduce_kernel<sum_functor>",
        ),
        (
            "void at::native::(anonymous namespace)::cdist_kernel_cuda_impl<float, at::native::(anonymous namespace)"
            "::dists<float>::two>(float*, float const*, float const*, float, int, int, int, long, long, long)",
            "cdist_kernel_cuda_impl<dists::two>",
        ),
        (
            "void cutlass::Kernel2<cutlass_80_simt_sgemm_128x128_8x4_nn_align1>(cutlass_80_simt_sgemm_128x128_8x4_nn_"
            "align1::Params)",
            "Kernel2<cutlass_80_simt_sgemm_128x128_8x4_nn_align1>",
        ),
        ("Memcpy DtoH (Device -> Pageable)", "Memcpy DtoH"),
        ("triton_poi_fused_add_gelu_0", "triton_poi_fused_add_gelu_0"),
        ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT", "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT"),
    ],
)
def test_short_kernel_names(full, short):
    assert short_kernel_name(full) == short


def test_long_names_are_cut_and_times_formatted():
    assert len(short_kernel_name("k" * 300, width=40)) == 40
    assert format_us(12.34) == "12.3 µs" and format_us(4567.0) == "4.57 ms" and format_us(2.5e6) == "2.50 s"


def test_without_the_launch_event_kineto_s_external_id_links_the_kernel():
    events = [
        _event("cpu_op", "aten::linear", 0.0, 50.0, **{"External id": 1}),
        _event("cpu_op", "aten::addmm", 5.0, 40.0, **{"External id": 2}),
        _event("kernel", "sm90_gemm", 30.0, 20.0, pid=0, tid=7, correlation=99, **{"External id": 2}),
    ]
    (row,) = build_table(Trace.from_json({"traceEvents": events})).ops
    assert row.name == "aten::linear" and row.kernels[0].launched_by == ["aten::addmm"]
