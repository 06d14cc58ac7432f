"""A user's own function as an op: `module:function` or `path/to/file.py:function`, benchmarked like any op.

The function takes `nargs` tensors of one shape. Its float64 run is the reference, so `check` compares the
low-precision run against the same function in float64. Bytes moved are estimated as the inputs read plus
one output of the input's size written.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from fuselab.ops.registry import Defaults, Impl, Op, Shape


def load_function(spec: str) -> Callable:
    """Import `module:function` or `file.py:function`; errors say what was wrong."""
    if ":" not in spec:
        raise ValueError(f"expected MODULE:FUNCTION or FILE.py:FUNCTION, got {spec!r}")
    where, name = spec.rsplit(":", 1)
    module = load_module(where)
    fn = getattr(module, name, None)
    if not callable(fn):
        raise LookupError(f"{where} has no function {name!r}")
    return fn


def load_module(where: str) -> object:
    """The module `where` names: a file (path/to/file.py, run as a fresh module) or an importable module name."""
    if not where.endswith(".py"):
        return _import_module(where)
    path = Path(where)
    if not path.exists():
        raise FileNotFoundError(f"no such file: {where}")
    module_spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def _import_module(name: str) -> object:
    """Import `name` as `python -c "import name"` would: the current folder is searched too."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name != name.split(".")[0] and not name.startswith(f"{exc.name}."):
            raise  # the module was found; something it imports is missing
        raise ModuleNotFoundError(
            f"no module named {name!r} in the current folder ({cwd}) or on sys.path; give the file instead "
            f"(path/to/{name.replace('.', '/')}.py:FUNCTION) or add its folder to PYTHONPATH",
            name=exc.name,
        ) from None


def returns_tensor(fn: Callable, spec: str) -> Callable:
    """fn, checked to return a torch.Tensor (a TypeError naming spec otherwise)."""

    @functools.wraps(fn)
    def checked(*args: object, **kwargs: object) -> torch.Tensor:
        out = fn(*args, **kwargs)
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"{spec} returned {type(out).__name__}, not a torch.Tensor; fuselab needs a tensor output")
        return out

    return checked


def user_op(spec: str, nargs: int = 1) -> Op:
    """An Op around the user's function (impl name: the function's name).

    The reference (the function run in float64, before any timing) checks that it returns a tensor, so the timed
    calls carry no check.
    """
    if nargs < 1:
        raise ValueError(f"--nargs must be at least 1, got {nargs}")
    fn = load_function(spec)

    def make_inputs(shape: Shape, dtype: torch.dtype, device: str, seed: int, **_: object) -> tuple[torch.Tensor, ...]:
        gen = torch.Generator(device="cpu").manual_seed(seed)
        return tuple(torch.randn(shape, generator=gen, dtype=torch.float32).to(device, dtype) for _ in range(nargs))

    def bytes_moved(shape: Shape, dtype: torch.dtype, **_: object) -> int:
        return (nargs + 1) * torch.Size(shape).numel() * torch.tensor([], dtype=dtype).element_size()

    name = getattr(fn, "__name__", "fn")
    return Op(
        name=spec,
        reference=returns_tensor(fn, spec),
        make_inputs=make_inputs,
        bytes_moved=bytes_moved,
        flops=lambda shape, **_: 0,
        tolerance={torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 2e-2, torch.float64: 1e-12},
        inputs=tuple(f"x{i}" for i in range(nargs)),
        defaults=Defaults(check_shapes=[(1000,)], bench_shapes=[(2**20,)], baseline=name),
        doc=f"user function {spec}",
        impls={name: Impl(name=name, fn=fn)},
    )
