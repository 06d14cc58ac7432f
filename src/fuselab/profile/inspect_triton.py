"""Triton kernels compiled as an implementation launches them: from the JIT cache after one run on a GPU, or,
without one, by intercepting the launches under the interpreter and compiling each with `triton.compile` for a target
(in a fresh process, the interpreter off)."""

from __future__ import annotations

import base64
import contextlib
import importlib
import importlib.util
import inspect as pyinspect
import json
import math
import os
import subprocess
import sys
import tempfile
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from fuselab.profile.asm import KernelAsm, Resources, _arch_number, cubin_sass, ptx_global_accesses, ptxas_resources

# Triton


def _unwrap(kernel: object) -> object:
    """The JITFunction (or InterpretedFunction) under autotune/heuristics wrappers."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    while not isinstance(kernel, (JITFunction, InterpretedFunction)) and hasattr(kernel, "fn"):
        kernel = kernel.fn
    return kernel


def _triton_asm(compiled: object, impl: str, origin: str, arch: str) -> KernelAsm:
    """A KernelAsm from a triton CompiledKernel."""
    asm = compiled.asm
    meta = compiled.metadata
    k = KernelAsm(
        name=meta.name,
        impl=impl,
        arch=arch,
        origin=origin,
        ptx=asm.get("ptx"),
        extra={key: asm[key] for key in ("ttir", "ttgir") if isinstance(asm.get(key), str)},
        num_warps=getattr(meta, "num_warps", None),
    )
    resources, why = ptxas_resources(k.ptx) if k.ptx else ({}, "no PTX")
    k.resources = resources.get(k.name, Resources())
    if why:
        k.notes.append(why)
        if getattr(compiled, "n_regs", None) is not None:  # known after the kernel was loaded on a GPU
            k.resources = Resources(registers=compiled.n_regs, spill_stores=compiled.n_spills)
    # Triton's shared memory is allocated dynamically; ptxas only sees the static part
    k.resources.shared_bytes = max(k.resources.shared_bytes or 0, getattr(meta, "shared", 0) or 0)
    if asm.get("cubin"):
        k.sass, why = cubin_sass(asm["cubin"])
        if why:
            k.notes.append(why)
    return k.analyze()


def triton_from_jit_cache(
    kernels: list[object], run: Callable[[], object], arch: str, impl: str = "triton"
) -> list[KernelAsm]:
    """On a GPU: call `run()` once and take, from Triton's JIT cache, the compiled kernels its launches used. The
    call runs with Triton's own launch: fuselab's C launcher and replays (fuselab.ops.launcher) skip
    JITFunction.run for a kernel launched before in the process."""
    from triton.runtime.jit import JITFunction

    from fuselab.ops import launcher

    ours = {id(k) for k in map(_unwrap, kernels)}
    used: dict[int, object] = {}
    original = JITFunction.run

    def record(self, *args, **kwargs):
        compiled = original(self, *args, **kwargs)
        if id(self) in ours and compiled is not None:
            used.setdefault(id(compiled), compiled)
        return compiled

    JITFunction.run = record
    try:
        with launcher.enabled(False):
            run()
        torch.cuda.synchronize()
    finally:
        JITFunction.run = original
    compiled = [c.result() if hasattr(c, "result") else c for c in used.values()]
    return [_triton_asm(c, impl, "Triton JIT cache after one run", arch) for c in compiled]


def triton_compile_offline(
    kernels: list[object], run: Callable[[], object], arch: str, impl: str = "triton"
) -> list[KernelAsm]:
    """Without a GPU: intercept the launches `run()` makes under the interpreter (they are not executed),
    specialize each as Triton's JIT would, and compile it for `arch`.

    The compile runs in a fresh Python process with the interpreter off: kernels that ran under the interpreter
    in this process leave triton.language patched for it, which the compiler cannot use.
    """
    launches = intercept(run, _arch_number(arch), kernels)
    jobs = [json.loads(job) for job in dict.fromkeys(one.job for one in launches)]  # distinct, in launch order
    if not jobs:
        return []
    out = []
    for job, result in zip(jobs, compile_jobs_offline(jobs, _arch_number(arch)), strict=True):
        compiled = types.SimpleNamespace(
            asm={**result["asm"], "cubin": base64.b64decode(result["cubin"]) if result.get("cubin") else None},
            metadata=types.SimpleNamespace(**result["metadata"]),
        )
        k = _triton_asm(compiled, impl, f"triton.compile for {arch} without a GPU (launch intercepted)", arch)
        attrs = {tuple(p): v for p, v in job["attrs"]}
        k.notes.append(f"specialization: {job['signature']}, attrs {attrs}")
        out.append(k)
    return out


@contextlib.contextmanager
def intercepted_launches(kernels: list[object] | None = None) -> Iterator[list[tuple[object, tuple, dict, object]]]:
    """Within the block, launches under the interpreter of `kernels` (None: of every kernel) are noted, not run: a
    list of (InterpretedFunction, args, kwargs, grid) per launch, as made."""
    from triton.runtime.interpreter import InterpretedFunction

    ours = None if kernels is None else {id(k) for k in map(_unwrap, kernels)}
    launches: list[tuple[object, tuple, dict, object]] = []
    original = InterpretedFunction.run

    def record(self, *args, grid, warmup, **kwargs):
        if ours is None or id(self) in ours:
            launches.append((self, args, kwargs, grid))
            return None
        return original(self, *args, grid=grid, warmup=warmup, **kwargs)

    InterpretedFunction.run = record
    try:
        yield launches
    finally:
        InterpretedFunction.run = original


def launch_job(interp: object, args: tuple, kwargs: dict, backend: object) -> dict:
    """The compile job of one launch intercepted under the interpreter (`interp` the InterpretedFunction, `args` and
    `kwargs` as launched): the kernel's module, file and name, and its signature, constexprs and attrs as Triton's JIT
    would specialize them for `backend`, with the launch's options (num_warps, maxnreg, ...). JSON-serializable."""
    from triton.runtime.jit import JITFunction, create_function_from_signature

    fn = getattr(interp, "fn", interp)
    jit = JITFunction(fn, **getattr(interp, "kwargs", {}))  # for the JIT's own specialization rules
    binder = create_function_from_signature(jit.signature, jit.params, backend)
    bound, specialization, options = binder(*args, **kwargs)
    _, signature, constexprs, attrs = jit._pack_args(backend, kwargs, bound, specialization, options)
    return {
        "module": fn.__module__,
        "file": pyinspect.getsourcefile(fn),
        "name": fn.__name__,
        "signature": signature,
        "constexprs": [[list(k), _encode_constexpr(v)] for k, v in constexprs.items()],
        "attrs": [[list(k), v] for k, v in attrs.items()],
        "options": {k: v for k, v in kwargs.items() if k not in jit.arg_names},
    }


def _encode_constexpr(value: object) -> object:
    import triton.language as tl

    if isinstance(value, tl.dtype):
        return {"dtype": value.name}
    if isinstance(value, tl.constexpr):
        return {"constexpr": value.value}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise ValueError(f"cannot compile offline with a constexpr of type {type(value).__name__}: {value!r}")


def compile_jobs_offline(jobs: list[dict], arch: int) -> list[dict]:
    """Each `launch_job` compiled with triton.compile for sm_`arch` in a fresh Python process, the interpreter off:
    per job {"asm": {"ptx", "ttir", "ttgir"}, "cubin": base64 or None, "metadata": {"name", "num_warps", "shared"}}."""
    with tempfile.TemporaryDirectory() as tmp:
        request, reply = Path(tmp) / "jobs.json", Path(tmp) / "compiled.json"
        request.write_text(json.dumps({"arch": arch, "jobs": jobs, "reply": str(reply)}))
        env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        code = "import sys; from fuselab.profile.inspect_triton import _compile_jobs; _compile_jobs(sys.argv[1])"
        proc = subprocess.run(
            [sys.executable, "-c", code, str(request)], capture_output=True, text=True, env=env, check=False
        )
        if proc.returncode != 0 or not reply.exists():
            raise RuntimeError(f"compiling the Triton kernels failed:\n{proc.stderr.strip()[-2000:]}")
        return json.loads(reply.read_text())


@dataclass(frozen=True)
class InterceptedLaunch:
    """One launch noted under the interpreter (`intercept`): its compile job as JSON (equal launches compile once),
    the programs in its grid, its warps, and its keyword arguments as launched (the plan's constexprs)."""

    job: str
    grid: int
    warps: int
    kwargs: dict


def intercept(
    run: Callable[[], object], arch: int = 90, kernels: list[object] | None = None
) -> list[InterceptedLaunch]:
    """Without a GPU: the launches of `kernels` (None: of every kernel) that `run()` makes under the interpreter (not
    executed), each specialized as Triton's JIT would for sm_`arch`."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend

    backend = make_backend(GPUTarget("cuda", arch, 32))
    with intercepted_launches(kernels) as noted:
        run()
    out = []
    for interp, args, kwargs, grid in noted:
        size = grid(kwargs) if callable(grid) else grid
        job = json.dumps(launch_job(interp, args, kwargs, backend), sort_keys=True, default=str)
        out.append(InterceptedLaunch(job, math.prod(size), int(kwargs.get("num_warps", 4)), kwargs))
    return out


@dataclass(frozen=True)
class CompiledLaunch:
    """What ptxas and Triton say of one compiled launch: registers a thread, spilled bytes (stores), shared memory
    (bytes), the widest global load a thread issues (bytes), and the cubin (None where ptxas did not run)."""

    name: str
    registers: int | None
    spills: int | None
    shared: int
    widest_load: int
    cubin: bytes | None = field(default=None, repr=False)


def compile_launches(jobs: list[str], arch: int) -> dict[str, CompiledLaunch]:
    """Each distinct job (`InterceptedLaunch.job`) compiled once for sm_`arch` (`compile_jobs_offline`), read back as
    a CompiledLaunch, by job."""
    distinct = sorted(set(jobs))
    out = {}
    for job, result in zip(distinct, compile_jobs_offline([json.loads(j) for j in distinct], arch), strict=True):
        ptx, name = result["asm"]["ptx"], result["metadata"]["name"]
        resources = ptxas_resources(ptx)[0].get(name)
        loads, _ = ptx_global_accesses(ptx)
        out[job] = CompiledLaunch(
            name=name,
            registers=resources.registers if resources else None,
            spills=resources.spill_stores if resources else None,
            shared=result["metadata"]["shared"],
            widest_load=loads[0].bytes if loads else 0,
            cubin=base64.b64decode(result["cubin"]) if result.get("cubin") else None,
        )
    return out


# An SM of sm_90 (H100, H200): registers, warps, resident programs (blocks), shared memory a program may use
SM90_LIMITS = {"registers": 65536, "warps": 64, "programs": 32, "shared": 227 * 1024}


def programs_per_sm(c: CompiledLaunch, warps: int, limits: dict[str, int] = SM90_LIMITS) -> int:
    """Programs of `warps` warps an SM holds at once: by registers (allocated 8 a thread at a time), warps and shared
    memory."""
    held = limits["programs"]
    if c.registers:
        held = min(held, limits["registers"] // (-(-c.registers // 8) * 8 * 32 * warps))
    held = min(held, limits["warps"] // warps)
    return min(held, limits["shared"] // c.shared) if c.shared else held


def _compile_jobs(request_path: str) -> None:
    """(In the fresh process.) Compile each job's kernel with triton.compile; write asm and metadata as JSON."""
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import convert_to_tuple_if_list

    request = json.loads(Path(request_path).read_text())
    target = GPUTarget("cuda", request["arch"], 32)
    backend = make_backend(target)
    results = []
    for job in request["jobs"]:
        try:
            module = importlib.import_module(job["module"])
        except ImportError:
            spec = importlib.util.spec_from_file_location(job["module"], job["file"])
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        kernel = _unwrap(getattr(module, job["name"]))

        def decode(v: object) -> object:
            if isinstance(v, dict) and "dtype" in v:
                return tl.dtype(v["dtype"])
            return tl.constexpr(v["constexpr"]) if isinstance(v, dict) else v

        constexprs = {tuple(p): decode(v) for p, v in job["constexprs"]}
        attrs = {tuple(p): v for p, v in job["attrs"]}
        signature = {k: convert_to_tuple_if_list(v) for k, v in job["signature"].items()}
        options = backend.parse_options(job["options"])
        compiled = triton.compile(
            ASTSource(kernel, signature, constexprs, attrs), target=target, options=options.__dict__
        )
        meta = compiled.metadata
        results.append(
            {
                "asm": {key: compiled.asm[key] for key in ("ptx", "ttir", "ttgir") if key in compiled.asm},
                "cubin": base64.b64encode(compiled.asm["cubin"]).decode() if "cubin" in compiled.asm else None,
                "metadata": {"name": meta.name, "num_warps": meta.num_warps, "shared": meta.shared},
            }
        )
    Path(request["reply"]).write_text(json.dumps(results))
