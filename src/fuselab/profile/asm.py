"""Reading compiled GPU code: the CUDA tools (nvcc, ptxas, cuobjdump, c++filt), PTX and SASS parsed for their global
memory accesses and kernels, ptxas's resource report, and one compiled kernel's record (`KernelAsm`).

Nothing here compiles Triton or knows an op: `inspect_cuda` and `inspect_triton` produce KernelAsm records,
`fuselab.profile.inspect` ties them to an op's implementation.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

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
