"""What a Triton or CUDA C++ implementation compiles to: PTX, SASS, registers, shared memory, spills.

    inspection = inspect_impl("gelu", "triton", dtype=torch.float32)
    print(inspection.summary())

Triton: on a GPU the impl runs once and its compiled kernels are read from Triton's JIT cache. Without a GPU
the impl runs under the interpreter with its kernel launches intercepted (not executed); each launch's
arguments give the same specialization the JIT would make (dtypes, 16-byte alignment, divisibility by 16),
and `triton.compile` builds it for the target (sm_90 by default). CUDA C++: the op's .cu file is compiled with
`nvcc -ptx` and `nvcc -cubin -Xptxas -v`. Registers, spills and shared memory come from ptxas; SASS from
cuobjdump (Triton ships one). The summary's key line is the widest global load and store: `ld.global.v4.b32`
moves 16 bytes per thread (vectorized), `ld.global.b32` only 4.

The parts: `asm` (the tools, PTX/SASS parsing, ptxas resources, KernelAsm), `inspect_cuda` (nvcc on a .cu file),
`inspect_triton` (Triton's JIT cache, or triton.compile without a GPU); here the Inspection of an op's impl. Their
public names stay importable from here.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from fuselab.bench.env import provenance
from fuselab.profile.asm import (
    DEFAULT_ARCH,
    GlobalAccess,
    KernelAsm,
    Resources,
    _arch_number,
    cubin_sass,
    default_arch,
    demangle,
    find_tool,
    parse_ptxas_info,
    ptx_entries,
    ptx_global_accesses,
    ptxas_resources,
    sass_functions,
    sass_global_accesses,
)
from fuselab.profile.inspect_cuda import _for_dtype, inspect_cuda_source
from fuselab.profile.inspect_triton import _unwrap, triton_compile_offline, triton_from_jit_cache

if TYPE_CHECKING:
    from fuselab.ops.registry import Shape

__all__ = [
    "DEFAULT_ARCH",
    "GlobalAccess",
    "Inspection",
    "KernelAsm",
    "Resources",
    "cubin_sass",
    "default_arch",
    "default_inspect_shape",
    "demangle",
    "find_tool",
    "inspect_cuda_source",
    "inspect_impl",
    "parse_ptxas_info",
    "ptx_entries",
    "ptx_global_accesses",
    "ptxas_resources",
    "sass_functions",
    "sass_global_accesses",
    "triton_compile_offline",
    "triton_from_jit_cache",
]


@dataclass
class Inspection:
    op: str
    impl: str
    arch: str
    kernels: list[KernelAsm]
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        lines = [f"{self.op} / {self.impl} on {self.arch}: {len(self.kernels)} kernel(s)"]
        lines += [k.summary() for k in self.kernels]
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {
            "op": self.op,
            "impl": self.impl,
            "arch": self.arch,
            "notes": self.notes,
            "kernels": [k.to_json() for k in self.kernels],
        }

    def write(self, out_dir: str | Path) -> list[Path]:
        """Write <kernel>.ptx, .sass (and Triton's .ttgir), inspect.json and summary.txt; return the paths."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        written = []
        for i, k in enumerate(self.kernels):
            stem = f"{i:02d}-" + re.sub(r"[^\w.-]+", "_", k.name).strip("_")[:80]
            for suffix, text in (("ptx", k.ptx), ("sass", k.sass), *k.extra.items()):
                if text:
                    path = out / f"{stem}.{suffix}"
                    path.write_text(text)
                    written.append(path)
        record = {**self.to_json(), "env": provenance()}  # what compiled them, and when
        (out / "inspect.json").write_text(json.dumps(record, indent=1) + "\n")
        (out / "summary.txt").write_text(self.summary() + "\n")
        return [*written, out / "inspect.json", out / "summary.txt"]


# an op's implementation


def default_inspect_shape(op_name: str) -> Shape:
    """The op's profile shape (else its smallest benchmark shape): big enough to specialize like a real run."""
    from fuselab.ops.registry import get_op

    return get_op(op_name).default_profile_shape()


def inspect_impl(
    op_name: str,
    impl_name: str,
    *,
    dtype: torch.dtype = torch.float32,
    shape: Shape | str | None = None,
    arch: str | None = None,
) -> Inspection:
    """PTX/SASS/resources of op `op_name`'s implementation `impl_name`: the Triton kernels its Impl lists
    (`Impl.triton_kernels`), compiled as the impl launches them at `shape`, or its CUDA source (`Impl.cuda_source`)."""
    from fuselab.evaluate import refuse_if_too_big
    from fuselab.ops.registry import get_op, parse_shape

    op = get_op(op_name)
    impl = op.get_impl(impl_name)
    arch = arch or default_arch()
    _arch_number(arch)
    if impl.cuda_source is not None:
        kernels, notes = inspect_cuda_source(Path(impl.cuda_source), arch=arch)
        kernels = _for_dtype(kernels, dtype, notes)
        return Inspection(op_name, impl_name, arch, kernels, notes)
    if impl.triton_kernels is None:
        inspectable = [name for name, i in op.impls.items() if i.inspectable]
        raise ValueError(
            f"inspect shows Triton and CUDA C++ kernels; {op_name} {impl_name!r} declares neither"
            f" (inspectable: {', '.join(inspectable) or 'none'})"
        )
    kernels = list(impl.triton_kernels())
    if not kernels:
        raise ValueError(f"{op_name} {impl_name} lists no Triton kernels")
    shape = parse_shape(shape) if isinstance(shape, str) else shape or op.default_profile_shape()
    gpu = torch.cuda.is_available()
    options = op.default_options()
    refuse_if_too_big(op, shape, dtype, "cuda" if gpu else "cpu", options, reference=False)
    inputs = op.make_inputs(shape, dtype, "cuda" if gpu else "cpu", 0, **options)

    def run() -> None:
        if not impl.backward:
            impl.fn(*inputs, **options)
            return
        leaves = [x.detach().requires_grad_(x.is_floating_point()) for x in inputs]
        out = impl.fn(*leaves, **options)
        out.backward(torch.ones_like(out))  # the backward kernels get compiled too

    notes = [f"specialized for shape {shape}, {str(dtype).removeprefix('torch.')}"]
    if gpu:
        asms = triton_from_jit_cache(kernels, run, arch, impl_name)
    else:
        if os.environ.get("TRITON_INTERPRET") != "1":
            raise RuntimeError("without a GPU, inspect needs TRITON_INTERPRET=1 (set by importing fuselab first)")
        from fuselab.ops import tuning

        model = tuning.MODELS.get(arch)
        with tuning.planning_as(model) if model is not None else contextlib.nullcontext():
            asms = triton_compile_offline(kernels, run, arch, impl_name)
        notes.append(f"no GPU here: compiled with triton.compile for {arch}, as the JIT would on that GPU")
        notes.append(
            f"planned as on {model.key} ({model.sms} SMs: its plan table, TMA, inline PTX)"
            if model is not None
            else f"planned as under the interpreter (no GPU of {arch} is known to plan for: "
            f"{', '.join(tuning.MODELS)} are), so tiles and warps may differ from that GPU's"
        )
    launched = {k.name for k in asms}
    idle = [name for name in (getattr(_unwrap(k), "__name__", "") for k in kernels) if name and name not in launched]
    if idle:
        notes.append(f"not launched at this shape, so not shown: {', '.join(idle)}")
    return Inspection(op_name, impl_name, arch, asms, notes)
