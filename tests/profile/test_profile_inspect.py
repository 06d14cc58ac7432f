"""inspect: PTX/SASS parsing, a CUDA source through nvcc, Triton kernels compiled for sm_90 without a GPU."""

import importlib.util
import os
from pathlib import Path

import pytest
import torch

from fuselab.profile.inspect import (
    find_tool,
    inspect_cuda_source,
    inspect_impl,
    parse_ptxas_info,
    ptx_global_accesses,
    sass_global_accesses,
    triton_compile_offline,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "profile"
needs_nvcc = pytest.mark.skipif(find_tool("nvcc") is None, reason="nvcc not found")
needs_offline_triton = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None or os.environ.get("TRITON_INTERPRET") != "1",
    reason="needs Triton and its interpreter (no GPU): the offline path",
)

PTX = """
.visible .entry k(
	@%p1 ld.global.v4.b32 { %r1, %r2, %r3, %r4 }, [ %rd1 + 0 ];
	ld.global.nc.L1::evict_last.u16 %rs1, [%rd9];
	ld.global.nc.u16 %rs2, [%rd10];
	@%p1 st.global.v4.b32 [ %rd3 + 0 ], { %r9, %r10, %r11, %r12 };
	st.global.b32 [ %rd4 + 0 ], %r13;
"""


def test_ptx_and_sass_access_widths():
    loads, stores = ptx_global_accesses(PTX)
    assert [(a.instr, a.count, a.bytes) for a in loads] == [("ld.global.v4.b32", 1, 16), ("ld.global.nc.u16", 2, 2)]
    assert [(a.instr, a.bytes) for a in stores] == [("st.global.v4.b32", 16), ("st.global.b32", 4)]
    sass = (
        "@!P0 LDG.E.128 R8, desc[UR4][R14.64] ;\n"
        " LDG.E.U16.CONSTANT R2, desc[UR4][R4.64] ;\n"
        " STG.E desc[UR4][R2.64], R4 ;"
    )
    sloads, sstores = sass_global_accesses(sass)
    assert [(a.instr, a.bytes) for a in sloads] == [("LDG.E.128", 16), ("LDG.E.U16.CONSTANT", 2)]
    assert [(a.instr, a.bytes) for a in sstores] == [("STG.E", 4)]


def test_ptxas_info_parsing():
    text = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z1kPf' for 'sm_90'
ptxas info    : Function properties for _Z1kPf
    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 2048 bytes smem, 360 bytes cmem[0]
ptxas info    : Compiling entry function 'small' for 'sm_90'
ptxas info    : Function properties for small
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 13 registers, used 0 barriers
"""
    info = parse_ptxas_info(text)
    big, small = info["_Z1kPf"], info["small"]
    assert (big.registers, big.shared_bytes, big.stack_bytes, big.spill_stores, big.spill_loads) == (255, 2048, 8, 4, 4)
    assert (small.registers, small.shared_bytes, small.spill_stores) == (13, 0, 0)


@needs_nvcc
def test_cuda_source_through_nvcc():
    kernels, notes = inspect_cuda_source(DATA / "tiny.cu", arch="sm_90")
    by_name = {k.name.split("(")[0]: k for k in kernels}
    assert set(by_name) == {"void scale_kernel<float>", "scale4_kernel"}
    vec, scalar = by_name["scale4_kernel"], by_name["void scale_kernel<float>"]
    assert vec.loads[0].bytes == 16 and vec.stores[0].bytes == 16  # float4: one 16-byte access per thread
    assert scalar.loads[0].bytes == 4 and scalar.stores[0].bytes == 4
    for k in kernels:
        assert 0 < k.resources.registers <= 255 and k.resources.spill_stores == 0
        assert ".entry" in k.ptx and k.arch == "sm_90"
    if find_tool("cuobjdump"):
        assert vec.sass_loads and vec.sass_loads[0].instr.startswith("LDG.E.128")
    else:
        assert any("cuobjdump" in n for n in notes)
    assert "widest ld.global.nc.v4.f32 = 16 B/thread (vectorized)" in vec.summary()


@needs_nvcc
def test_cuda_source_that_does_not_compile(tmp_path):
    bad = tmp_path / "bad.cu"
    bad.write_text("__global__ void k() { this is not C++ }\n")
    kernels, notes = inspect_cuda_source(bad)
    assert kernels == [] and "nvcc -ptx failed on bad.cu" in notes[0]


def _load_test_kernels():
    spec = importlib.util.spec_from_file_location("fuselab_test_triton_scale", DATA / "triton_scale.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@needs_offline_triton
def test_triton_kernel_compiled_for_sm90_without_a_gpu():
    mod = _load_test_kernels()
    aligned, odd = torch.randn(4096), torch.randn(4097)
    (k,) = triton_compile_offline([mod.scale_kernel], lambda: mod.scale(aligned), "sm_90")
    assert k.name == "scale_kernel" and k.arch == "sm_90" and k.num_warps == 4
    assert k.loads[0].instr == "ld.global.v4.b32" and k.stores[0].instr == "st.global.v4.b32"
    assert k.resources.registers and k.resources.spill_stores == 0
    assert "(vectorized)" in k.summary()
    # n = 4097 is not a multiple of 16: Triton cannot prove the mask is 4-aligned, so no vector loads
    (k_odd,) = triton_compile_offline([mod.scale_kernel], lambda: mod.scale(odd), "sm_90")
    assert k_odd.loads[0].bytes == 4 and "(not vectorized)" in k_odd.summary()
    # a kernel calling triton.language's own @jit functions (tl.max) compiles too, even after the interpreter ran
    # it here (the interpreter leaves triton.language patched after such kernels)
    x = torch.randn(5, 100)
    torch.testing.assert_close(mod.row_max(x), x.max(dim=1).values)
    (k_max,) = triton_compile_offline([mod.row_max_kernel], lambda: mod.row_max(x), "sm_90")
    assert k_max.name == "row_max_kernel" and k_max.ptx and ".target sm_90" in k_max.ptx
    # and the interpreter still runs kernels afterwards
    torch.testing.assert_close(mod.row_max(x), x.max(dim=1).values)
    torch.testing.assert_close(mod.scale(odd), 2 * odd)


def _impl_or_skip(op: str, impl: str) -> None:
    from fuselab.ops.registry import get_op

    try:
        get_op(op).get_impl(impl)
    except (KeyError, ImportError) as exc:
        pytest.skip(f"{op}/{impl} not available: {exc}")


@needs_offline_triton
def test_inspect_gelu_triton_impl():
    _impl_or_skip("gelu", "triton")
    result = inspect_impl("gelu", "triton", dtype=torch.float32, shape="2^16")
    assert result.kernels and result.arch == "sm_90"
    forward = result.kernels[0]
    assert forward.loads[0].bytes == 16  # 2^16 fp32: aligned, vectorized
    assert "gelu" in result.summary()


@needs_offline_triton
@pytest.mark.slow
def test_inspect_attention_without_a_gpu_plans_as_the_h200():
    """Without a GPU, inspect compiles what the H200 would launch (tuning.planning_as): the TMA kernels of a bf16
    shape on 4-warp tiles of the H200's table, not the interpreter's pointer kernels on one warp; and says so."""
    _impl_or_skip("attention", "triton")
    result = inspect_impl("attention", "triton", dtype=torch.bfloat16, shape="2x8x1000x128", arch="sm_90")
    names = {k.name for k in result.kernels}
    # d 128: dS stored by the dK/dV kernel for a dQ kernel of one product (tk.stores_scores)
    assert {"attention_fwd_tma_kernel", "attention_bwd_dkdv_tma_kernel", "attention_bwd_dq_ds_kernel"} <= names
    assert all(k.num_warps >= 4 for k in result.kernels), [(k.name, k.num_warps) for k in result.kernels]
    assert any("planned as on nvidia-h200-sm90" in note for note in result.notes), result.notes


@needs_nvcc
def test_inspect_gelu_cuda_impl(tmp_path):
    _impl_or_skip("gelu", "cuda")
    result = inspect_impl("gelu", "cuda", dtype=torch.float32, arch="sm_90")
    assert result.kernels
    assert all("float" in k.name for k in result.kernels)
    files = result.write(tmp_path)
    assert (tmp_path / "summary.txt").read_text().startswith("gelu / cuda on sm_90")
    assert any(p.suffix == ".ptx" for p in files)
