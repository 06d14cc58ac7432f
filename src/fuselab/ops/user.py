"""A user's own function as an op: `module:function` or `path/to/file.py:function`, benchmarked like any op.

The function takes `nargs` tensors of one shape. Its float64 run is the reference, so `check` compares the
low-precision run against the same function in float64. Bytes moved are estimated as the inputs read plus
one output of the input's size written.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from pathlib import Path

import torch

from fuselab.ops.registry import Impl, Op, Shape


def load_function(spec: str) -> Callable:
    """Import `module:function` or `file.py:function`; errors say what was wrong."""
    if ":" not in spec:
        raise ValueError(f"expected MODULE:FUNCTION or FILE.py:FUNCTION, got {spec!r}")
    where, name = spec.rsplit(":", 1)
    if where.endswith(".py"):
        path = Path(where)
        if not path.exists():
            raise FileNotFoundError(f"no such file: {where}")
        module_spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(where)
    fn = getattr(module, name, None)
    if not callable(fn):
        raise LookupError(f"{where} has no function {name!r}")
    return fn


def user_op(spec: str, nargs: int = 1) -> Op:
    """An Op around the user's function (impl name: the function's name)."""
    fn = load_function(spec)

    def make_inputs(shape: Shape, dtype: torch.dtype, device: str, seed: int, **_: object) -> tuple[torch.Tensor, ...]:
        gen = torch.Generator(device="cpu").manual_seed(seed)
        return tuple(torch.randn(shape, generator=gen, dtype=torch.float32).to(device, dtype) for _ in range(nargs))

    def bytes_moved(shape: Shape, dtype: torch.dtype, **_: object) -> int:
        return (nargs + 1) * torch.Size(shape).numel() * torch.tensor([], dtype=dtype).element_size()

    name = getattr(fn, "__name__", "fn")
    return Op(
        name=spec,
        reference=fn,
        make_inputs=make_inputs,
        bytes_moved=bytes_moved,
        flops=lambda shape, **_: 0,
        tolerance={torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 2e-2, torch.float64: 1e-12},
        inputs=tuple(f"x{i}" for i in range(nargs)),
        check_shapes=[(1000,)],
        bench_shapes=[(2**20,)],
        baseline=name,
        doc=f"user function {spec}",
        impls={name: Impl(name=name, fn=fn)},
    )
