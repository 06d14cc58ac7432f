"""What every op's Triton and CUDA C++ implementations share: availability, builds, input checks."""

from __future__ import annotations

import functools
import importlib.util
import inspect
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import TypeVar

import torch

from fuselab.bench.dtypes import dtype_name

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
R = TypeVar("R")


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
    name: str | None = None,
) -> torch.Tensor:
    """Raise a clear TypeError/ValueError when `x` is not a tensor this impl accepts; return it.

    name: what the messages call x where the impl takes several tensors ("q"); None: its one input.
    """
    if not isinstance(x, torch.Tensor):
        expected = f"{name} must be" if name else "expected"
        raise TypeError(f"{impl}: {expected} a torch.Tensor, got {type(x).__name__}")
    if not _on(x, devices):
        raise ValueError(
            f"{impl}: {name or 'input'} is on {x.device}, but this implementation runs on {'/'.join(devices)} only;"
            f" move it with .to('{devices[0]}')"
        )
    if x.dtype not in dtypes:
        accepted = ", ".join(dtype_name(d) for d in dtypes)
        of = f" of {name}" if name else ""
        raise TypeError(f"{impl}: dtype {dtype_name(x.dtype)}{of} is not supported; accepted: {accepted}")
    if x.dim() < min_dim:
        raise ValueError(
            f"{impl}: expected {name or 'a tensor'} with at least {min_dim} dimension(s), got shape {tuple(x.shape)}"
        )
    return x


def _on(x: torch.Tensor, devices: Sequence[str]) -> bool:
    """x.device.type in devices; is_cuda and is_cpu first (a tenth of the cost of building x.device)."""
    return (x.is_cuda and "cuda" in devices) or (x.is_cpu and "cpu" in devices) or x.device.type in devices


def checked_inputs(
    fn: Callable[..., R],
    *,
    impl: str,
    names: Sequence[str],
    devices: Sequence[str],
    dtypes: Sequence[torch.dtype] = FLOAT_DTYPES,
    min_dim: int = 0,
) -> Callable[..., R]:
    """fn, refusing first (with check_tensor's errors) leading tensor arguments that the impl does not accept.

    names: what fn's first len(names) parameters are called in the messages (the op's inputs: ("q", "k", "v");
        one alone is not named).
    The test is built once, the declared tuples closed over, and reads only cheap attributes, so torch.compile traces
    it (as guards) and a call costs a fraction of a microsecond; only a refused input takes the slow path.
    """
    devices, dtypes, n = tuple(devices), tuple(dtypes), len(names)
    cpu, cuda = "cpu" in devices, "cuda" in devices
    labels = tuple(names) if n > 1 else (None,)  # one input: the messages need not name it
    tensor = torch.Tensor
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    params = [p.name for p in inspect.signature(fn).parameters.values() if p.kind in positional]

    def refuse(args: tuple, kwargs: dict) -> None:
        """check_tensor on each input given, by position or by keyword, every one's type first (a missing one is left
        to fn's own error; a device type besides cpu/cuda that the impl declares passes here)."""
        given = []
        for i, name in enumerate(labels):
            if i < len(args):
                given.append((name, args[i]))
            elif i < len(params) and params[i] in kwargs:
                given.append((name, kwargs[params[i]]))
        for name, t in sorted(given, key=lambda item: isinstance(item[1], tensor)):
            check_tensor(t, impl=impl, devices=devices, dtypes=dtypes, min_dim=min_dim, name=name)

    @functools.wraps(fn)
    def checked(*args: object, **kwargs: object) -> R:
        if len(args) < n:
            refuse(args, kwargs)
        for t in args[:n]:
            if not (
                isinstance(t, tensor)
                and ((cuda and t.is_cuda) or (cpu and t.is_cpu))
                and t.dtype in dtypes
                and (not min_dim or t.dim() >= min_dim)
            ):
                refuse(args, kwargs)
        return fn(*args, **kwargs)

    return checked


def input_check(
    *, impl: str, names: Sequence[str], devices: Sequence[str], dtypes: Sequence[torch.dtype] = FLOAT_DTYPES,
    min_dim: int = 0,
) -> Callable[..., None]:  # fmt: skip
    """check(*args): checked_inputs' test of the leading tensor arguments alone (a custom op's `check`)."""
    return checked_inputs(_accept, impl=impl, names=names, devices=devices, dtypes=dtypes, min_dim=min_dim)


def _accept(*args: object) -> None:
    """Nothing beyond the input check it is wrapped in."""


def check_matches(grad: torch.Tensor, of: torch.Tensor, *, impl: str, names: tuple[str, str]) -> None:
    """Raise a ValueError unless `grad` has the shape, dtype and device of `of` (names: how the message calls them)."""
    if grad.shape != of.shape or grad.dtype != of.dtype or grad.device != of.device:
        raise ValueError(
            f"{impl}: {names[0]} {tuple(grad.shape)} {grad.dtype} on {grad.device} must match"
            f" {names[1]} {tuple(of.shape)} {of.dtype} on {of.device}"
        )
