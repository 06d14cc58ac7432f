"""Every CUDA source under src/fuselab/ops compiles with plain `nvcc -arch=sm_90 -c` (no torch headers needed), and
every C++ binding passes the compiler's syntax and type checks against torch's headers, as torch.utils.cpp_extension
would build it: kernels and bindings are checked on machines without a GPU, as in CI. Skipped where there is no nvcc,
no C++ compiler or no CUDA headers."""

from __future__ import annotations

import os
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest
from torch.utils.cpp_extension import CUDA_HOME

OPS_DIR = Path(__file__).resolve().parents[2] / "src" / "fuselab" / "ops"
CU_FILES = sorted(OPS_DIR.glob("*/*.cu"))
CPP_FILES = sorted(OPS_DIR.glob("*/*.cpp"))
NVCC = shutil.which("nvcc")
CXX = shutil.which("g++") or shutil.which("c++")
# cpp_extension's CUDA_HOME (None in a CPU build of torch), else the toolkit's usual home
CUDA_INCLUDE = Path(CUDA_HOME or os.environ.get("CUDA_PATH") or "/usr/local/cuda") / "include"


def test_there_are_cuda_sources() -> None:
    assert any(f.name == "gelu.cu" for f in CU_FILES), f"no gelu.cu under {OPS_DIR}"
    assert any(f.name == "softmax_binding.cpp" for f in CPP_FILES), f"no softmax_binding.cpp under {OPS_DIR}"


@pytest.mark.skipif(NVCC is None, reason="nvcc not found (install the CUDA toolkit to check the .cu sources)")
@pytest.mark.parametrize("source", CU_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_cu_compiles_for_sm_90(source: Path, tmp_path: Path) -> None:
    cmd = [NVCC, "-arch=sm_90", "-c", str(source), "-o", str(tmp_path / f"{source.stem}.o")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stderr[-4000:]}"
    assert (tmp_path / f"{source.stem}.o").stat().st_size > 0


@pytest.mark.skipif(CXX is None, reason="no C++ compiler (g++) to check the bindings")
@pytest.mark.skipif(
    not (CUDA_INCLUDE / "cuda_runtime.h").exists(),
    reason="no CUDA headers (install the CUDA toolkit to check the bindings)",
)
@pytest.mark.parametrize("source", CPP_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_cpp_binding_compiles_against_torch(source: Path, tmp_path: Path) -> None:
    """`g++ -fsyntax-only` with the include paths, defines and standard cpp_extension builds a binding with (the
    CPU wheel of torch lacks one generated header of c10/cuda, which only names a build option: an empty one is
    put in its place). A binding that does not compile fails here, not on the GPU's first call."""
    from torch.utils.cpp_extension import include_paths

    torch_includes = include_paths()
    macros = Path("c10/cuda/impl/cuda_cmake_macros.h")
    if not any((Path(p) / macros).exists() for p in torch_includes):
        (tmp_path / macros).parent.mkdir(parents=True)
        (tmp_path / macros).write_text("#pragma once\n")
    includes = [*torch_includes, str(tmp_path), str(CUDA_INCLUDE), sysconfig.get_paths()["include"]]
    cmd = [CXX, "-fsyntax-only", "-std=c++17", f"-DTORCH_EXTENSION_NAME={source.stem}",
           "-DTORCH_API_INCLUDE_EXTENSION_H", *(f"-isystem{p}" for p in includes), str(source)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stderr[-4000:]}"
