"""What every op's Triton and CUDA C++ implementations share: availability, builds, input checks."""

from __future__ import annotations

import functools
import importlib.util
import inspect
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
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

    sources: paths of .cpp/.cu files (C++ alone still gets the CUDA headers and runtime: c10/cuda's streams). The
    build directory is ~/.cache/fuselab/ext/<name>; ninja rebuilds what an edited source or header touches.
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
        with_cuda=True,
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
    """fn, refusing first (with check_tensor's errors) its leading tensor arguments that the impl does not accept.

    names: what fn's first len(names) parameters (its tensors) are called in the messages (the op's inputs:
        ("q", "k", "v"); one alone is not named).
    The wrapper is written once, here, with fn's own parameters (a *args/**kwargs wrapper costs more than its test)
    and the declared tuples bound: the test reads only cheap attributes (is_cuda, is_cpu, dtype, dim), so a call
    costs a fraction of a microsecond and torch.compile traces it as guards; a refused input takes the slow path.
    """
    devices, dtypes, n = tuple(devices), tuple(dtypes), len(names)
    labels = tuple(names) if n > 1 else (None,)  # one input: the messages need not name it
    signature = inspect.signature(fn)
    params = list(signature.parameters.values())
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if len(params) < n or any(p.kind not in positional for p in params[:n]):
        raise ValueError(f"{impl}: the first {n} parameters of {fn.__qualname__} must be its inputs {tuple(names)}")
    tensors = [p.name for p in params[:n]]

    def refuse(*given: object) -> None:
        """check_tensor on each input, every one's type first (a device type besides cpu/cuda that the impl declares
        passes here)."""
        for label, t in sorted(zip(labels, given, strict=True), key=lambda item: isinstance(item[1], torch.Tensor)):
            check_tensor(t, impl=impl, devices=devices, dtypes=dtypes, min_dim=min_dim, name=label)

    def accepted(t: str) -> str:
        """The test of parameter `t`, as Python source."""
        on = [f"{t}.is_{d}" for d in ("cuda", "cpu") if d in devices]
        if set(devices) - {"cuda", "cpu"}:
            on.append(f"{t}.device.type in _devices")
        rank = f" and {t}.dim() >= {min_dim}" if min_dim else ""
        return f"isinstance({t}, _Tensor) and ({' or '.join(on)}) and {t}.dtype in _dtypes{rank}"

    bare = [p.replace(default=inspect.Parameter.empty, annotation=inspect.Parameter.empty) for p in params]
    declared = signature.replace(parameters=bare, return_annotation=inspect.Signature.empty)
    forwarded = ", ".join(_forwarded(p) for p in params)
    call = "None" if getattr(fn, "test_only", False) else f"_fn({forwarded})"  # input_check: the test alone
    source = (
        f"def checked{declared}:\n"
        f"    if not ({' and '.join(accepted(t) for t in tensors)}):\n"
        f"        _refuse({', '.join(tensors)})\n"
        f"    return {call}\n"
    )
    scope = {"_fn": fn, "_refuse": refuse, "_Tensor": torch.Tensor, "_dtypes": dtypes, "_devices": devices}
    exec(compile(source, f"<input check of {impl}>", "exec"), scope)  # source made above from fn's parameter names
    checked = functools.wraps(fn)(scope["checked"])
    defaults = tuple(p.default for p in params if p.kind in positional and p.default is not p.empty)
    checked.__defaults__ = defaults or None
    keywords = {p.name: p.default for p in params if p.kind is p.KEYWORD_ONLY and p.default is not p.empty}
    checked.__kwdefaults__ = keywords or None
    checked.input_spec = InputSpec(impl, tuple(names), devices, dtypes, min_dim)
    return checked


def _forwarded(p: inspect.Parameter) -> str:
    """How the wrapper passes parameter p on: x, *args, scale=scale, **kwargs."""
    if p.kind is p.VAR_POSITIONAL:
        return f"*{p.name}"
    if p.kind is p.VAR_KEYWORD:
        return f"**{p.name}"
    return f"{p.name}={p.name}" if p.kind is p.KEYWORD_ONLY else p.name


def input_check(
    *, impl: str, names: Sequence[str], devices: Sequence[str], dtypes: Sequence[torch.dtype] = FLOAT_DTYPES,
    min_dim: int = 0,
) -> Callable[..., None]:  # fmt: skip
    """check(*tensors, *rest): checked_inputs' test of the leading tensors alone (a custom op's `check`); its
    `input_spec` says what it tests."""
    n = len(names)

    def accept(*args: object) -> None:
        """Nothing beyond the test of the tensors."""

    accept.test_only = True  # checked_inputs writes the test without a call after it
    accept.__signature__ = inspect.Signature(  # the tensors as parameters of their own, then the rest
        [inspect.Parameter(f"t{i}", inspect.Parameter.POSITIONAL_ONLY) for i in range(n)]
        + [inspect.Parameter("rest", inspect.Parameter.VAR_POSITIONAL)]
    )
    return checked_inputs(accept, impl=impl, names=names, devices=devices, dtypes=dtypes, min_dim=min_dim)


@dataclass(frozen=True)
class InputSpec:
    """What a generated input test accepts: the impl's name in messages, its inputs' names, devices, dtypes, rank."""

    impl: str
    names: tuple[str, ...]
    devices: tuple[str, ...]
    dtypes: tuple[torch.dtype, ...]
    min_dim: int


def check_matches(grad: torch.Tensor, of: torch.Tensor, *, impl: str, names: tuple[str, str]) -> None:
    """Raise a ValueError unless `grad` has the shape, dtype and device of `of` (names: how the message calls them)."""
    if grad.shape != of.shape or grad.dtype != of.dtype or grad.device != of.device:
        raise ValueError(
            f"{impl}: {names[0]} {tuple(grad.shape)} {grad.dtype} on {grad.device} must match"
            f" {names[1]} {tuple(of.shape)} {of.dtype} on {of.device}"
        )
