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
"""

from __future__ import annotations

import base64
import importlib
import importlib.util
import inspect as pyinspect
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import types
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from fuselab.ops.registry import Shape

DEFAULT_ARCH = "sm_90"

# finding the tools


def find_tool(name: str) -> str | None:
    """A CUDA binary (nvcc, ptxas, cuobjdump, c++filt) from PATH, CUDA_HOME, /usr/local/cuda or Triton's own."""
    found = shutil.which(name)
    if found:
        return found
    dirs = [os.environ.get("CUDA_HOME", ""), "/usr/local/cuda"]
    try:
        import triton

        dirs.append(str(Path(triton.__file__).parent / "backends" / "nvidia"))
    except ImportError:
        pass
    for d in dirs:
        candidate = Path(d) / "bin" / name
        if d and candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, check=False)


# reading PTX and SASS


@dataclass
class GlobalAccess:
    """A form of global memory instruction, e.g. ld.global.v4.b32: `bytes` moved per thread per instruction."""

    instr: str
    count: int
    bytes: int


_PTX_GLOBAL = re.compile(r"\b(ld|st)\.global((?:\.[\w:]+)*)")
_PTX_TYPE = re.compile(r"^[bfsu](8|16|32|64|128)$")


def ptx_global_accesses(ptx: str) -> tuple[list[GlobalAccess], list[GlobalAccess]]:
    """(loads, stores) in `ptx`, widest first. Cache hints (.L1::evict_last, ...) are left out of the form."""
    found: dict[str, Counter] = {"ld": Counter(), "st": Counter()}
    size: dict[str, int] = {}
    for m in _PTX_GLOBAL.finditer(ptx):
        mods = [t for t in m.group(2).split(".") if t and "::" not in t]
        vec = next((int(t[1:]) for t in mods if re.fullmatch(r"v\d+", t)), 1)
        bits = next((int(_PTX_TYPE.match(t).group(1)) for t in mods if _PTX_TYPE.match(t)), 0)
        form = ".".join([m.group(1), "global", *mods])
        found[m.group(1)][form] += 1
        size[form] = vec * bits // 8
    loads, stores = (
        sorted((GlobalAccess(f, n, size[f]) for f, n in found[k].items()), key=lambda a: (-a.bytes, -a.count))
        for k in ("ld", "st")
    )
    return loads, stores


_SASS_GLOBAL = re.compile(r"\b(LDG|STG)((?:\.\w+)*)")
_SASS_BYTES = {"128": 16, "64": 8, "U16": 2, "S16": 2, "U8": 1, "S8": 1}


def sass_global_accesses(sass: str) -> tuple[list[GlobalAccess], list[GlobalAccess]]:
    """(loads, stores) in SASS: LDG.E.128 moves 16 bytes per thread, plain LDG.E 4."""
    found: dict[str, Counter] = {"LDG": Counter(), "STG": Counter()}
    for m in _SASS_GLOBAL.finditer(sass):
        found[m.group(1)][m.group(1) + m.group(2)] += 1

    def width(form: str) -> int:
        return next((b for t, b in _SASS_BYTES.items() if t in form.split(".")), 4)

    return tuple(
        sorted((GlobalAccess(f, n, width(f)) for f, n in found[k].items()), key=lambda a: (-a.bytes, -a.count))
        for k in ("LDG", "STG")
    )  # type: ignore[return-value]


def ptx_entries(ptx: str) -> dict[str, str]:
    """Split a PTX module into its kernels: entry name -> the text from its .entry to the next one."""
    marks = list(re.finditer(r"\.entry\s+([\w$]+)", ptx))
    return {
        m.group(1): ptx[m.start() : (marks[i + 1].start() if i + 1 < len(marks) else len(ptx))]
        for i, m in enumerate(marks)
    }


def sass_functions(sass: str) -> dict[str, str]:
    marks = list(re.finditer(r"Function\s*:\s*(\S+)", sass))
    return {
        m.group(1): sass[m.start() : (marks[i + 1].start() if i + 1 < len(marks) else len(sass))]
        for i, m in enumerate(marks)
    }


@dataclass
class Resources:
    registers: int | None = None
    shared_bytes: int | None = None
    stack_bytes: int | None = None
    spill_stores: int | None = None
    spill_loads: int | None = None


def parse_ptxas_info(text: str) -> dict[str, Resources]:
    """Per kernel, what `ptxas -v` reported: registers, static shared memory, stack frame, spills (bytes)."""
    out: dict[str, Resources] = {}
    current: str | None = None
    for line in text.splitlines():
        if m := re.search(r"(?:Compiling entry function|Function properties for)\s+'?([\w$]+)'?", line):
            current = m.group(1)
            out.setdefault(current, Resources())
            continue
        if current is None:
            continue
        r = out[current]
        if m := re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line):
            r.stack_bytes, r.spill_stores, r.spill_loads = map(int, m.groups())
        if m := re.search(r"Used (\d+) registers", line):
            r.registers = int(m.group(1))
            smem = re.search(r"(\d+) bytes smem", line)
            r.shared_bytes = int(smem.group(1)) if smem else 0
    return out


def demangle(names: list[str]) -> dict[str, str]:
    """Mangled C++ names -> readable ones (via c++filt when present, else unchanged)."""
    tool = find_tool("c++filt")
    if not tool or not names:
        return {n: n for n in names}
    proc = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True, check=False)
    readable = proc.stdout.splitlines()
    return (
        dict(zip(names, readable, strict=True))
        if proc.returncode == 0 and len(readable) == len(names)
        else {n: n for n in names}
    )


# one kernel's report


@dataclass
class KernelAsm:
    """A compiled kernel: its assembly, resources and global memory access widths."""

    name: str
    impl: str
    arch: str
    origin: str  # how it was obtained
    ptx: str | None = None
    sass: str | None = None
    extra: dict[str, str] = field(default_factory=dict)  # other stages (Triton's ttir, ttgir, llir)
    resources: Resources = field(default_factory=Resources)
    num_warps: int | None = None
    loads: list[GlobalAccess] = field(default_factory=list)
    stores: list[GlobalAccess] = field(default_factory=list)
    sass_loads: list[GlobalAccess] = field(default_factory=list)
    sass_stores: list[GlobalAccess] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def analyze(self) -> KernelAsm:
        if self.ptx:
            self.loads, self.stores = ptx_global_accesses(self.ptx)
        if self.sass:
            self.sass_loads, self.sass_stores = sass_global_accesses(self.sass)
        return self

    def summary(self) -> str:
        r = self.resources
        head = f"{self.name} ({self.impl}, {self.arch}"
        head += f", {self.num_warps} warps)" if self.num_warps else ")"
        parts = []
        if r.registers is not None:
            parts.append(f"{r.registers} registers/thread")
        if r.spill_stores is not None:
            spilled = (r.spill_stores or 0) + (r.spill_loads or 0)
            parts.append(
                "no spills" if spilled == 0 else f"SPILLS: {r.spill_stores} B stored, {r.spill_loads} B loaded"
            )
        if r.shared_bytes is not None:
            parts.append(f"{r.shared_bytes} B shared memory")
        lines = [head + (": " + ", ".join(parts) if parts else "")]
        for label, accesses in (("global loads ", self.loads), ("global stores", self.stores)):
            lines.append(f"  {label}: {_describe(accesses)}")
        if self.sass_loads or self.sass_stores:
            forms = ", ".join(f"{a.instr} x{a.count}" for a in (*self.sass_loads, *self.sass_stores))
            lines.append(f"  SASS         : {forms}")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def to_json(self) -> dict:
        d = asdict(self)
        for key in ("ptx", "sass", "extra"):
            d.pop(key)
        return d


def _describe(accesses: list[GlobalAccess]) -> str:
    if not accesses:
        return "none in the PTX"
    widest = accesses[0]
    verdict = "vectorized" if widest.bytes >= 8 else "not vectorized" if widest.bytes else "width unknown"
    forms = ", ".join(f"{a.instr} x{a.count}" for a in accesses)
    return f"widest {widest.instr} = {widest.bytes} B/thread ({verdict}); all: {forms}"


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
        (out / "inspect.json").write_text(json.dumps(self.to_json(), indent=1) + "\n")
        (out / "summary.txt").write_text(self.summary() + "\n")
        return [*written, out / "inspect.json", out / "summary.txt"]


def _arch_number(arch: str) -> int:
    m = re.fullmatch(r"sm_(\d+)a?", arch)
    if not m:
        raise ValueError(f"bad arch {arch!r}: expected sm_<major><minor>, e.g. sm_90")
    return int(m.group(1))


def default_arch() -> str:
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        return f"sm_{major}{minor}"
    return DEFAULT_ARCH


def ptxas_resources(ptx: str) -> tuple[dict[str, Resources], str | None]:
    """Assemble PTX with `ptxas -v` for the target in its .target line; (resources per kernel, why not)."""
    tool = find_tool("ptxas")
    if tool is None:
        return {}, "ptxas not found: registers and spills unknown"
    target = re.search(r"^\s*\.target\s+(sm_\w+)", ptx, re.M)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        proc = _run([tool, "-v", f"-arch={target.group(1) if target else DEFAULT_ARCH}", str(src), "-o", os.devnull])
    if proc.returncode != 0:
        return {}, f"ptxas failed: {proc.stderr.strip()[:300]}"
    return parse_ptxas_info(proc.stderr + proc.stdout), None


def cubin_sass(cubin: bytes | Path) -> tuple[str | None, str | None]:
    """SASS of a cubin via `cuobjdump --dump-sass`; (sass, why not)."""
    tool = find_tool("cuobjdump")
    if tool is None:
        return None, "cuobjdump not found: no SASS"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(cubin) if isinstance(cubin, Path) else Path(tmp) / "k.cubin"
        if not isinstance(cubin, Path):
            path.write_bytes(cubin)
        proc = _run([tool, "--dump-sass", str(path)])
    if proc.returncode != 0:
        return None, f"cuobjdump failed: {proc.stderr.strip()[:300]}"
    return proc.stdout, None


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


def triton_from_jit_cache(kernels: list[object], run: Callable[[], object], arch: str) -> list[KernelAsm]:
    """On a GPU: call `run()` once and take, from Triton's JIT cache, the compiled kernels its launches used."""
    from triton.runtime.jit import JITFunction

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
        run()
        torch.cuda.synchronize()
    finally:
        JITFunction.run = original
    compiled = [c.result() if hasattr(c, "result") else c for c in used.values()]
    return [_triton_asm(c, "triton", "Triton JIT cache after one run", arch) for c in compiled]


def triton_compile_offline(kernels: list[object], run: Callable[[], object], arch: str) -> list[KernelAsm]:
    """Without a GPU: intercept the launches `run()` makes under the interpreter (they are not executed),
    specialize each as Triton's JIT would, and compile it for `arch`.

    The compile runs in a fresh Python process with the interpreter off: kernels that ran under the interpreter
    in this process leave triton.language patched for it, which the compiler cannot use.
    """
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction, create_function_from_signature

    ours = {id(k) for k in map(_unwrap, kernels)}
    launches: list[tuple[object, tuple, dict]] = []
    original = InterpretedFunction.run

    def record(self, *args, grid, warmup, **kwargs):
        if id(self) in ours:
            launches.append((self, args, kwargs))
            return None
        return original(self, *args, grid=grid, warmup=warmup, **kwargs)

    InterpretedFunction.run = record
    try:
        run()
    finally:
        InterpretedFunction.run = original

    backend = make_backend(GPUTarget("cuda", _arch_number(arch), 32))
    jobs, seen = [], set()
    for interp, args, kwargs in launches:
        fn = getattr(interp, "fn", interp)
        jit = JITFunction(fn, **getattr(interp, "kwargs", {}))  # for the JIT's own specialization rules
        binder = create_function_from_signature(jit.signature, jit.params, backend)
        bound, specialization, options = binder(*args, **kwargs)
        _, signature, constexprs, attrs = jit._pack_args(backend, kwargs, bound, specialization, options)
        job = {
            "module": fn.__module__,
            "file": pyinspect.getsourcefile(fn),
            "name": fn.__name__,
            "signature": signature,
            "constexprs": [[list(k), _encode_constexpr(v)] for k, v in constexprs.items()],
            "attrs": [[list(k), v] for k, v in attrs.items()],
            "options": {k: v for k, v in kwargs.items() if k not in jit.arg_names},
        }
        key = json.dumps(job, sort_keys=True, default=str)
        if key not in seen:
            seen.add(key)
            jobs.append(job)
    if not jobs:
        return []
    out = []
    for job, result in zip(jobs, _compile_in_fresh_process(jobs, _arch_number(arch)), strict=True):
        compiled = types.SimpleNamespace(
            asm={**result["asm"], "cubin": base64.b64decode(result["cubin"]) if result.get("cubin") else None},
            metadata=types.SimpleNamespace(**result["metadata"]),
        )
        k = _triton_asm(compiled, "triton", f"triton.compile for {arch} without a GPU (launch intercepted)", arch)
        attrs = {tuple(p): v for p, v in job["attrs"]}
        k.notes.append(f"specialization: {job['signature']}, attrs {attrs}")
        out.append(k)
    return out


def _encode_constexpr(value: object) -> object:
    import triton.language as tl

    if isinstance(value, tl.dtype):
        return {"dtype": value.name}
    if isinstance(value, tl.constexpr):
        return {"constexpr": value.value}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise ValueError(f"cannot compile offline with a constexpr of type {type(value).__name__}: {value!r}")


def _compile_in_fresh_process(jobs: list[dict], arch: int) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        request, reply = Path(tmp) / "jobs.json", Path(tmp) / "compiled.json"
        request.write_text(json.dumps({"arch": arch, "jobs": jobs, "reply": str(reply)}))
        env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        code = "import sys; from fuselab.profile.inspect import _compile_jobs; _compile_jobs(sys.argv[1])"
        proc = subprocess.run(
            [sys.executable, "-c", code, str(request)], capture_output=True, text=True, env=env, check=False
        )
        if proc.returncode != 0 or not reply.exists():
            raise RuntimeError(f"compiling the Triton kernels failed:\n{proc.stderr.strip()[-2000:]}")
        return json.loads(reply.read_text())


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
        asms = triton_from_jit_cache(kernels, run, arch)
    else:
        if os.environ.get("TRITON_INTERPRET") != "1":
            raise RuntimeError("without a GPU, inspect needs TRITON_INTERPRET=1 (set by importing fuselab first)")
        asms = triton_compile_offline(kernels, run, arch)
        notes.append(f"no GPU here: compiled with triton.compile for {arch}, as the JIT would on that GPU")
    launched = {k.name for k in asms}
    idle = [name for name in (getattr(_unwrap(k), "__name__", "") for k in kernels) if name and name not in launched]
    if idle:
        notes.append(f"not launched at this shape, so not shown: {', '.join(idle)}")
    return Inspection(op_name, impl_name, arch, asms, notes)


_CTYPES = {torch.float32: ("float",), torch.float16: ("__half", "half"), torch.bfloat16: ("__nv_bfloat16", "bfloat16")}


def _for_dtype(kernels: list[KernelAsm], dtype: torch.dtype, notes: list[str]) -> list[KernelAsm]:
    """The template instances for `dtype` when their names say so; all kernels otherwise."""
    words = _CTYPES.get(dtype, ())
    chosen = [k for k in kernels if any(re.search(rf"\b{re.escape(w)}\b", k.name) for w in words)]
    if chosen and len(chosen) < len(kernels):
        notes.append(f"{len(kernels) - len(chosen)} kernel(s) for other dtypes left out")
        return chosen
    return kernels
