"""What every op's Triton and CUDA C++ implementations share: availability, builds, input checks."""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import torch

from fuselab.bench.dtypes import dtype_name

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def triton_unavailable(device_type: str) -> str | None:
    """None when Triton kernels can run on `device_type` here, else why not."""
    if importlib.util.find_spec("triton") is None:
        return "Triton is not installed (pip install triton)"
    if device_type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        return "Triton runs on the CPU only under its interpreter: set TRITON_INTERPRET=1 before importing fuselab"
    return None


def cuda_unavailable(device_type: str) -> str | None:
    """None when a CUDA C++ extension can be built and run here, else why not."""
    if device_type != "cuda" or not torch.cuda.is_available():
        return "CUDA C++ kernels need an NVIDIA GPU and a CUDA build of torch; none here"
    if torch.version.cuda is None:
        return "this torch build has no CUDA support"
    if shutil.which("nvcc") is None and not os.environ.get("CUDA_HOME"):
        return "nvcc was not found (install the CUDA toolkit or set CUDA_HOME)"
    from torch.utils.cpp_extension import is_ninja_available

    if not is_ninja_available():
        return "ninja was not found (pip install ninja); torch.utils.cpp_extension needs it to build"
    return None


def cuda_arch_flags() -> list[str]:
    """nvcc flags for the GPU in this process (sm_90 on an H100/H200), native code, no PTX JIT."""
    major, minor = torch.cuda.get_device_capability()
    return [f"-gencode=arch=compute_{major}{minor},code=sm_{major}{minor}"]


@functools.cache
def load_cuda_extension(name: str, sources: tuple[str, ...]) -> ModuleType:
    """Build (once, cached on disk by torch.utils.cpp_extension) and import a CUDA extension.

    sources: paths of .cpp/.cu files. The build directory is ~/.cache/fuselab/ext/<name>.
    """
    from torch.utils.cpp_extension import load

    build_dir = Path(os.environ.get("FUSELAB_EXT_DIR", Path.home() / ".cache" / "fuselab" / "ext")) / name
    build_dir.mkdir(parents=True, exist_ok=True)
    return load(
        name=name,
        sources=list(sources),
        build_directory=str(build_dir),
        extra_cflags=["-O3"],
        extra_cuda_cflags=["-O3", "--use_fast_math", *cuda_arch_flags()],
        verbose=False,
    )


def check_tensor(
    x: object,
    *,
    impl: str,
    devices: Sequence[str] = ("cuda",),
    dtypes: Sequence[torch.dtype] = FLOAT_DTYPES,
    min_dim: int = 0,
) -> torch.Tensor:
    """Raise a clear TypeError/ValueError when `x` is not a tensor this impl accepts; return it."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{impl}: expected a torch.Tensor, got {type(x).__name__}")
    if x.device.type not in devices:
        raise ValueError(
            f"{impl}: input is on {x.device}, but this implementation runs on {'/'.join(devices)} only;"
            f" move it with .to('{devices[0]}')"
        )
    if x.dtype not in dtypes:
        names = ", ".join(dtype_name(d) for d in dtypes)
        raise TypeError(f"{impl}: dtype {dtype_name(x.dtype)} is not supported; accepted: {names}")
    if x.dim() < min_dim:
        raise ValueError(f"{impl}: expected a tensor with at least {min_dim} dimension(s), got shape {tuple(x.shape)}")
    return x


def check_matches(grad: torch.Tensor, of: torch.Tensor, *, impl: str, names: tuple[str, str]) -> None:
    """Raise a ValueError unless `grad` has the shape, dtype and device of `of` (names: how the message calls them)."""
    if grad.shape != of.shape or grad.dtype != of.dtype or grad.device != of.device:
        raise ValueError(
            f"{impl}: {names[0]} {tuple(grad.shape)} {grad.dtype} on {grad.device} must match"
            f" {names[1]} {tuple(of.shape)} {of.dtype} on {of.device}"
        )
