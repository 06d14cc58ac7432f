"""A torch-free CUDA C++ source compiled with nvcc for a target GPU: PTX, SASS and ptxas's resources per kernel."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import torch

from fuselab.profile.asm import (
    DEFAULT_ARCH,
    KernelAsm,
    Resources,
    _arch_number,
    _run,
    cubin_sass,
    demangle,
    find_tool,
    parse_ptxas_info,
    ptx_entries,
    sass_functions,
)

# CUDA C++


def inspect_cuda_source(
    path: str | Path, *, arch: str = DEFAULT_ARCH, flags: tuple[str, ...] = ("-O3", "--use_fast_math")
) -> tuple[list[KernelAsm], list[str]]:
    """Compile a torch-free .cu file with nvcc for `arch`; (a KernelAsm per kernel in it, notes)."""
    path = Path(path)
    _arch_number(arch)
    nvcc = find_tool("nvcc")
    if nvcc is None:
        return [], ["nvcc not found: cannot compile the CUDA source (install the CUDA toolkit or set CUDA_HOME)"]
    notes: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        base = [nvcc, f"-arch={arch}", *flags, f"-I{path.parent}", str(path)]
        ptx_file, cubin_file = Path(tmp) / "k.ptx", Path(tmp) / "k.cubin"
        proc = _run([*base, "-ptx", "-o", str(ptx_file)])
        if proc.returncode != 0:
            return [], [f"nvcc -ptx failed on {path.name}: {proc.stderr.strip()[:600]}"]
        ptx = ptx_file.read_text()
        proc = _run([*base, "-cubin", "-Xptxas", "-v", "-o", str(cubin_file)])
        if proc.returncode != 0:
            return [], [f"nvcc -cubin failed on {path.name}: {proc.stderr.strip()[:600]}"]
        resources = parse_ptxas_info(proc.stderr + proc.stdout)
        sass, why = cubin_sass(cubin_file)
    if why:
        notes.append(why)
    entries = ptx_entries(ptx)
    sass_by_name = sass_functions(sass) if sass else {}
    readable = demangle(list(entries))
    kernels = []
    for mangled, text in entries.items():
        k = KernelAsm(
            name=readable[mangled],
            impl="cuda",
            arch=arch,
            origin=f"nvcc -arch={arch} {' '.join(flags)} {path.name}",
            ptx=text,
            sass=sass_by_name.get(mangled),
            resources=resources.get(mangled, Resources()),
        )
        kernels.append(k.analyze())
    return kernels, notes


_CTYPES = {torch.float32: ("float",), torch.float16: ("__half", "half"), torch.bfloat16: ("__nv_bfloat16", "bfloat16")}


def _for_dtype(kernels: list[KernelAsm], dtype: torch.dtype, notes: list[str]) -> list[KernelAsm]:
    """The template instances for `dtype` when their names say so; all kernels otherwise."""
    words = _CTYPES.get(dtype, ())
    chosen = [k for k in kernels if any(re.search(rf"\b{re.escape(w)}\b", k.name) for w in words)]
    if chosen and len(chosen) < len(kernels):
        notes.append(f"{len(kernels) - len(chosen)} kernel(s) for other dtypes left out")
        return chosen
    return kernels
