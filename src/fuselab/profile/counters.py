"""Hardware counters: why a kernel is slow, measured with Nsight Compute (`ncu`) and held against the op's cost model.

    result = profile_counters(get_op("gelu"), ["naive", "triton"], shape=(2**26,))
    print(result.text())            # per impl: DRAM bytes against the minimum, then one verdict line per kernel

How it runs: the parent starts `ncu ... python -m fuselab.profile.counters --child SPEC.json`. The child makes each
case's inputs, calls it `warmup` times outside any range, then calls it inside the NVTX range `fuselab-counters`;
ncu profiles only kernels launched in that range (`--nvtx-include fuselab-counters/`), so set-up, compilation and
warm-up launches are never measured. Each case in the range starts with one `torch.cuda._sleep` launch (the
`spin_kernel` marker) so that kernels are assigned to cases by order, whichever way the report is read.
ncu flushes the caches before every profiled kernel (its default `--cache-control all`) and leaves the clocks alone
(`--clock-control none`, as this project's machines require).

Results are read through Nsight Compute's Python module `ncu_report` (in its extras/python) when it imports, else
from its CSV export (`ncu --import REP --csv --page raw --print-units base`); never from the text it prints.
Units everywhere: bytes, nanoseconds, percent.
"""

from __future__ import annotations

import argparse
import csv
import glob
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from fuselab.ops.registry import Op

RANGE = "fuselab-counters"
MARKER = "spin_kernel"  # torch.cuda._sleep's kernel: one launched at the start of each case inside the range
MARKER_CYCLES = 1000

# ncu sections whose metrics we read (names as `ncu --list-sections` gives them), and metrics asked for by name.
SECTIONS = ("SpeedOfLight", "Occupancy", "LaunchStats")  # SpeedOfLight carries the per-pipe utilization breakdown
STALL_REASONS = (
    "barrier", "branch_resolving", "dispatch_stall", "drain", "gmma", "imc_miss", "lg_throttle", "long_scoreboard",
    "math_pipe_throttle", "membar", "mio_throttle", "misc", "no_instruction", "not_selected", "short_scoreboard",
    "sleeping", "tex_throttle", "wait",
)  # fmt: skip
EXTRA_METRICS = (
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "lts__t_bytes.sum",
    "gpu__time_duration.sum",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    *(f"smsp__average_warps_issue_stalled_{r}_per_issue_active.ratio" for r in STALL_REASONS),
)

# role -> candidate metric names (the first one present is used): names moved between ncu versions.
ROLES: dict[str, tuple[str, ...]] = {
    "duration_ns": ("gpu__time_duration.sum",),
    "dram_read": ("dram__bytes_read.sum",),
    "dram_write": ("dram__bytes_write.sum",),
    "l2_bytes": ("lts__t_bytes.sum",),
    "dram_pct": (
        "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
        "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    ),
    "l2_pct": ("lts__throughput.avg.pct_of_peak_sustained_elapsed",),
    "l1_pct": (
        "l1tex__throughput.avg.pct_of_peak_sustained_active",
        "l1tex__throughput.avg.pct_of_peak_sustained_elapsed",
    ),
    "memory_pct": ("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",),
    "sm_pct": ("sm__throughput.avg.pct_of_peak_sustained_elapsed",),
    "occupancy_pct": ("sm__warps_active.avg.pct_of_peak_sustained_active",),
    "theoretical_occupancy_pct": ("sm__maximum_warps_per_active_cycle_pct",),
    "registers": ("launch__registers_per_thread",),
    "smem_static": ("launch__shared_mem_per_block_static",),
    "smem_dynamic": ("launch__shared_mem_per_block_dynamic",),
    "block_size": ("launch__block_size",),
    "grid_size": ("launch__grid_size",),
    "waves": ("launch__waves_per_multiprocessor",),
    "limit_registers": ("launch__occupancy_limit_registers",),
    "limit_shared_mem": ("launch__occupancy_limit_shared_mem",),
    "limit_warps": ("launch__occupancy_limit_warps",),
    "limit_blocks": ("launch__occupancy_limit_blocks",),
}
# per-reason warp stalls (cycles a warp spent stalled per issued instruction) and per-pipe utilization
STALL = re.compile(r"^smsp__average_warps?_(?:issue_stalled|latency_issue_stalled)_(\w+?)_per_issue_active\.ratio$")
PIPE = re.compile(r"^sm__pipe_(\w+?)_cycles_active\.avg\.pct_of_peak_sustained_(?:active|elapsed)$")
NOT_STALLS = {"selected"}  # the cycle an instruction issues is no stall

BOUND_PCT = 60.0  # a unit at or above this share of its peak is what bounds the kernel (ncu's own rule of thumb)

PERMISSION_HINTS = ("ERR_NVGPUCTRPERM", "LibraryNotLoaded", "not permitted", "permission", "Failed to initialize")


class CountersUnavailable(RuntimeError):
    """Hardware counters cannot be read here (no GPU, no ncu, counters not permitted); the message says why."""


# ------------------------------------------------------------------------------------------------ finding ncu


def find_ncu() -> str | None:
    """The ncu executable: $FUSELAB_NCU, the PATH, then CUDA's and Nsight Compute's usual folders."""
    explicit = os.environ.get("FUSELAB_NCU")
    if explicit:
        return explicit if Path(explicit).is_file() else None
    found = shutil.which("ncu")
    if found:
        return found
    patterns = ("/usr/local/cuda*/bin/ncu", "/opt/nvidia/nsight-compute/*/ncu", "/usr/local/NVIDIA-Nsight-Compute*/ncu")
    candidates = sorted((p for pat in patterns for p in glob.glob(pat)), reverse=True)
    return candidates[0] if candidates else None


def ncu_python_dirs(ncu: str) -> list[Path]:
    """Folders that may hold ncu's Python report module (extras/python beside the real executable)."""
    real = Path(ncu).resolve()
    dirs = [real.parent / "extras" / "python", real.parent.parent / "extras" / "python"]
    dirs += [Path(p) / "extras" / "python" for p in sorted(glob.glob("/opt/nvidia/nsight-compute/*"), reverse=True)]
    return [d for d in dirs if (d / "ncu_report.py").is_file()]


def import_ncu_report(ncu: str | None):  # -> module | None
    """ncu's `ncu_report` module, or None when it does not import here."""
    try:
        import ncu_report  # type: ignore[import-not-found]

        return ncu_report
    except ImportError:
        pass
    for folder in ncu_python_dirs(ncu) if ncu else []:
        sys.path.insert(0, str(folder))
        try:
            import ncu_report  # type: ignore[import-not-found]

            return ncu_report
        except ImportError:
            sys.path.remove(str(folder))
    return None


def counters_unavailable(device: str = "cuda") -> str | None:
    """Why hardware counters cannot be read on `device` here (one line), or None when ncu and a GPU are there.

    Whether the driver lets this user read the counters is only known once ncu runs (see run_ncu).
    """
    import torch

    if not str(device).startswith("cuda"):
        return f"hardware counters need a CUDA GPU, not {device}"
    if not torch.cuda.is_available():
        return "hardware counters need a CUDA GPU; none is visible in this process"
    if find_ncu() is None:
        return "Nsight Compute (ncu) not found: put it on the PATH or set FUSELAB_NCU"
    return None


# ------------------------------------------------------------------------------------------------ the cases


@dataclass(frozen=True)
class Case:
    """One thing to run under ncu: an op's impl on seeded inputs of `shape`."""

    op: str
    impl: str
    shape: tuple[int, ...]
    dtype: str = "float32"
    options: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        from fuselab.bench.shapes import format_shape

        dims = format_shape(self.shape)
        opts = "".join(f" {k}={v}" for k, v in sorted(self.options.items()))
        return f"{self.op} {self.impl} {dims} {self.dtype}{opts}"


def _child(spec_path: Path, status_path: Path) -> int:
    """Run every case of the spec: warm-ups outside the range, then marker + `iters` calls inside it."""
    import torch

    from fuselab.bench.dtypes import parse_dtype
    from fuselab.ops.registry import get_op
    from fuselab.profile.capture import impl_callable

    spec = json.loads(spec_path.read_text())
    statuses = []
    for raw in spec["cases"]:
        case = Case(raw["op"], raw["impl"], tuple(raw["shape"]), raw["dtype"], raw.get("options") or {})
        error = None
        fn = None
        try:
            op = get_op(case.op)
            reason = op.get_impl(case.impl).unavailable("cuda")
            if reason:
                raise RuntimeError(reason)
            fn = impl_callable(op, case.impl, case.shape, parse_dtype(case.dtype), "cuda", case.options)
            for _ in range(spec["warmup"]):
                fn()
            torch.cuda.synchronize()
        except Exception as exc:  # the case is reported as failed; the others still run
            error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
            fn = None
        torch.cuda.nvtx.range_push(RANGE)
        torch.cuda._sleep(MARKER_CYCLES)  # the marker: this case's kernels follow it
        if fn is not None:
            for _ in range(spec["iters"]):
                fn()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
        statuses.append({"label": case.label, "error": error})
        del fn
        torch.cuda.empty_cache()
    status_path.write_text(json.dumps(statuses, indent=1) + "\n")
    return 0


# ------------------------------------------------------------------------------------------------ running ncu


def ncu_command(ncu: str, spec: Path, status: Path, report: Path, kernel_regex: str | None = None) -> list[str]:
    """The ncu command line that profiles the child's in-range kernels (markers always kept)."""
    cmd = [ncu, "--clock-control", "none", "--nvtx", "--nvtx-include", f"{RANGE}/", "--force-overwrite"]
    if kernel_regex:
        cmd += ["--kernel-name", f"regex:{MARKER}|{kernel_regex}"]
    for section in SECTIONS:
        cmd += ["--section", section]
    cmd += ["--metrics", ",".join(EXTRA_METRICS), "--export", str(report)]
    cmd += [sys.executable, "-m", "fuselab.profile.counters", "--child", str(spec), "--status", str(status)]
    return cmd


def explain_failure(output: str, rc: int) -> str:
    """One line saying why ncu gave no counters, from its own error lines."""
    errors = [line.strip() for line in output.splitlines() if "==ERROR==" in line]
    text = errors[0].replace("==ERROR==", "").strip() if errors else f"ncu exited with status {rc}"
    if any(h.lower() in output.lower() for h in PERMISSION_HINTS):
        return f"ncu could not read the hardware counters here (not permitted or not supported): {text}"
    return f"ncu failed: {text}"


def run_ncu(
    cases: Sequence[Case],
    out_dir: Path,
    *,
    warmup: int = 2,
    iters: int = 1,
    kernel_regex: str | None = None,
    timeout_s: float = 900.0,
) -> tuple[list[dict], list[dict], str]:
    """Profile `cases` in one ncu run; returns (kernels in launch order, the child's statuses, how they were read).

    Writes out_dir/counters.ncu-rep (open it in Nsight Compute's GUI), spec.json, status.json, ncu.log, and
    raw.csv when the CSV export was read. Raises CountersUnavailable with one line when ncu gives no counters.
    """
    ncu = find_ncu()
    if ncu is None:
        raise CountersUnavailable("Nsight Compute (ncu) not found: put it on the PATH or set FUSELAB_NCU")
    out_dir.mkdir(parents=True, exist_ok=True)
    spec, status, report = out_dir / "spec.json", out_dir / "status.json", out_dir / "counters.ncu-rep"
    spec.write_text(json.dumps({"cases": [asdict(c) for c in cases], "warmup": warmup, "iters": iters}) + "\n")
    status.unlink(missing_ok=True)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH", "")]),
    }
    cmd = ncu_command(ncu, spec, status, report, kernel_regex)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    log = proc.stdout + proc.stderr
    (out_dir / "ncu.log").write_text(" ".join(cmd) + "\n\n" + log)
    if proc.returncode != 0 or not report.exists():
        raise CountersUnavailable(explain_failure(log, proc.returncode))
    statuses = json.loads(status.read_text()) if status.exists() else []
    kernels, source = read_report(ncu, report, out_dir)
    return kernels, statuses, source


def read_report(ncu: str, report: Path, out_dir: Path | None = None) -> tuple[list[dict], str]:
    """The kernels of an .ncu-rep in launch order: [{"id", "name", "metrics": {name: value}}], and the reader used."""
    module = import_ncu_report(ncu)
    if module is not None:
        try:
            return read_with_ncu_report(module, report), "ncu_report"
        except Exception:  # an ncu_report of another version: the CSV export still works
            pass
    proc = subprocess.run(
        [ncu, "--import", str(report), "--csv", "--page", "raw", "--print-units", "base"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if proc.returncode != 0:
        raise CountersUnavailable(explain_failure(proc.stdout + proc.stderr, proc.returncode))
    if out_dir is not None:
        (out_dir / "raw.csv").write_text(proc.stdout)
    return parse_raw_csv(proc.stdout), "csv"


def wanted(name: str) -> bool:
    """The metrics fuselab reads (the rest of what the sections collect stays in the .ncu-rep)."""
    return any(name in names for names in ROLES.values()) or bool(STALL.match(name) or PIPE.match(name))


def read_with_ncu_report(module, report: Path) -> list[dict]:  # module: ncu_report
    ctx = module.load_report(str(report))
    kernels = []
    for r in range(ctx.num_ranges()):
        rng = ctx.range_by_idx(r)
        for a in range(rng.num_actions()):
            action = rng.action_by_idx(a)
            metrics = {}
            for name in action.metric_names():
                if not wanted(name):
                    continue
                metric = action.metric_by_name(name)
                kind = metric.metric_type()
                if kind == module.IMetric.MetricType_FLOAT:
                    metrics[name] = float(metric.as_double())
                elif kind == module.IMetric.MetricType_UINT64:
                    metrics[name] = float(metric.as_uint64())
            kernels.append({"id": len(kernels), "name": action.name(), "metrics": metrics})
    return kernels


_NUMBER = re.compile(r"^-?[\d,]*\.?\d+(?:[eE][-+]?\d+)?$")
_SCALE = {
    "byte": 1.0, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9, "tbyte": 1e12,
    "ns": 1.0, "nsecond": 1.0, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6, "s": 1e9, "second": 1e9,
}  # fmt: skip


def parse_value(text: str, unit: str = "") -> float | None:
    """A CSV cell as a number in base units (bytes, ns); None for text, 'n/a' and empty cells."""
    text = text.strip()
    if not _NUMBER.match(text):
        return None
    return float(text.replace(",", "")) * _SCALE.get(unit.strip().lower(), 1.0)


def parse_raw_csv(text: str) -> list[dict]:
    """Kernels from `ncu --csv --page raw` (first row metric names, second row units, then one row per kernel)."""
    rows = [r for r in csv.reader(io.StringIO(text)) if r and not r[0].startswith("==")]
    if len(rows) < 2 or "ID" not in rows[0]:
        raise ValueError("not ncu's raw CSV page: no header row with an 'ID' column")
    header, units = rows[0], rows[1]
    name_col = header.index("Kernel Name") if "Kernel Name" in header else header.index("Function Name")
    kernels = []
    for row in rows[2:]:
        if len(row) != len(header):
            continue
        metrics = {}
        for col, name in enumerate(header):
            if wanted(name):
                value = parse_value(row[col], units[col] if col < len(units) else "")
                if value is not None:
                    metrics[name] = value
        kernels.append(
            {"id": int(parse_value(row[header.index("ID")]) or 0), "name": row[name_col], "metrics": metrics}
        )
    return kernels


def split_by_marker(kernels: Sequence[dict], n_cases: int) -> list[list[dict]]:
    """Kernels per case: each case's kernels follow its marker launch. Raises ValueError on a count mismatch."""
    groups: list[list[dict]] = []
    for k in kernels:
        if MARKER in k["name"]:
            groups.append([])
        elif groups:
            groups[-1].append(k)
    if len(groups) != n_cases:
        raise ValueError(f"found {len(groups)} case marker(s) ({MARKER}) in the report, expected {n_cases}")
    return groups


# ------------------------------------------------------------------------------------------------ reading a kernel


@dataclass
class Kernel:
    """The counters of one profiled kernel launch. Bytes, nanoseconds, percent of peak."""

    name: str
    metrics: dict[str, float]

    def get(self, role: str) -> float | None:
        for name in ROLES[role]:
            if name in self.metrics:
                return self.metrics[name]
        return None

    @property
    def duration_ns(self) -> float:
        return self.get("duration_ns") or 0.0

    @property
    def dram_bytes(self) -> float:
        return (self.get("dram_read") or 0.0) + (self.get("dram_write") or 0.0)

    def stalls(self) -> list[tuple[str, float]]:
        """(reason, cycles stalled per issued instruction), largest first."""
        out = []
        for name, value in self.metrics.items():
            m = STALL.match(name)
            if m and m.group(1) not in NOT_STALLS and value > 0:
                out.append((m.group(1), value))
        return sorted(out, key=lambda kv: -kv[1])

    def pipes(self) -> dict[str, float]:
        """Utilization (% of peak while the SM is active) per pipe, e.g. fma, alu, tensor_op_hmma."""
        out: dict[str, float] = {}
        for name, value in self.metrics.items():
            m = PIPE.match(name)
            if m:
                out[m.group(1)] = max(value, out.get(m.group(1), 0.0))
        return out

    def tensor_pct(self) -> float | None:
        values = [v for k, v in self.pipes().items() if "tensor" in k]
        return max(values) if values else None

    def fma_pct(self) -> float | None:
        values = [v for k, v in self.pipes().items() if k in ("fma", "fmaheavy", "alu", "fp64")]
        return max(values) if values else None

    def occupancy_limiter(self) -> str | None:
        """What caps the blocks per SM: registers, shared memory, warps (block size) or the block-count limit."""
        limits = {
            "registers": self.get("limit_registers"),
            "shared memory": self.get("limit_shared_mem"),
            "warps per SM": self.get("limit_warps"),
            "blocks per SM": self.get("limit_blocks"),
        }
        known = {k: v for k, v in limits.items() if v is not None}
        return min(known, key=lambda k: known[k]) if known else None

    def short_name(self) -> str:
        from fuselab.profile.table import short_kernel_name

        return short_kernel_name(self.name)


def verdict(k: Kernel) -> tuple[str, str]:
    """(bound, one line) for a kernel: memory-bound at N% of a memory peak, compute-bound at N% of a pipe's peak,
    or latency-bound (neither unit busy: occupancy and the stall that dominates)."""
    dram = k.get("dram_pct") or 0.0
    caches = {"L2": k.get("l2_pct"), "L1": k.get("l1_pct")}
    level, cache_pct = max(
        ((n, v) for n, v in caches.items() if v is not None), key=lambda kv: kv[1], default=("", 0.0)
    )
    tensor, fma, sm = k.tensor_pct() or 0.0, k.fma_pct() or 0.0, k.get("sm_pct") or 0.0
    if dram >= BOUND_PCT and dram >= max(tensor, fma):
        return "memory", f"memory-bound at {dram:.0f}% of DRAM peak"
    if cache_pct >= BOUND_PCT and cache_pct >= max(tensor, fma):
        return "memory", f"memory-bound at {cache_pct:.0f}% of {level} peak (DRAM {dram:.0f}%)"
    if tensor >= BOUND_PCT:
        return "compute", f"compute-bound at {tensor:.0f}% of tensor peak"
    if fma >= BOUND_PCT:
        return "compute", f"compute-bound at {fma:.0f}% of FMA/ALU peak"
    if sm >= BOUND_PCT:
        return "compute", f"compute-bound at {sm:.0f}% of SM peak (issue, not one pipe)"
    parts = [f"{k.duration_ns / 1e3:.3g} µs"]
    occ, theo = k.get("occupancy_pct"), k.get("theoretical_occupancy_pct")
    if occ is not None:
        limiter = k.occupancy_limiter()
        parts.append(
            f"occupancy {occ:.0f}%"
            + (f" of {theo:.0f}% theoretical" if theo is not None else "")
            + (f" (limit: {limiter})" if limiter and theo is not None and theo < 100 else "")
        )
    waves = k.get("waves")
    if waves is not None and waves < 1:
        parts.append(f"{waves:.2g} waves: too few blocks to fill the GPU")
    stalls = k.stalls()
    if stalls:
        parts.append(f"top stall {stalls[0][0]} ({stalls[0][1]:.1f} cycles/instr)")
    return "latency", "latency-bound: " + ", ".join(parts) + f"; DRAM {k.get('dram_pct') or 0:.0f}%, SM {sm:.0f}%"


# ------------------------------------------------------------------------------------------------ against the model


def assess_case(case: Case, kernels: Sequence[dict], iters: int = 1, error: str | None = None) -> dict:
    """One case's kernels held against its op's cost model: DRAM bytes against the minimum, time, verdicts.

    Returns a JSON-able dict: per-call totals (dram_bytes, l2_bytes, duration_ns), model_bytes and model_flops,
    bytes_ratio (measured DRAM / minimum), achieved GB/s and TFLOP/s over the kernels' summed time, and kernels
    (one entry per distinct launch of one call, each with its counters and verdict).
    """
    from fuselab.bench.dtypes import parse_dtype
    from fuselab.ops.registry import get_op

    op = get_op(case.op)
    dtype = parse_dtype(case.dtype)
    options = op.resolve_options(case.options)
    model_bytes = op.bytes_moved(case.shape, dtype, **options)
    model_flops = op.flops(case.shape, **options)
    out: dict = {
        **asdict(case),
        "label": case.label,
        "bound_model": op.bound,
        "model_bytes": model_bytes,
        "model_flops": model_flops,
        "error": error,
        "kernels": [],
    }
    if error or not kernels:
        out["error"] = error or "no kernel was launched inside the range"
        return out
    rows = [Kernel(k["name"], k["metrics"]) for k in kernels]
    per_call = len(rows) // iters if iters > 0 and len(rows) % iters == 0 else len(rows)
    dram = sum(k.dram_bytes for k in rows) / iters
    l2 = sum(k.get("l2_bytes") or 0.0 for k in rows) / iters
    duration = sum(k.duration_ns for k in rows) / iters
    out.update(
        dram_bytes=dram,
        dram_read=sum(k.get("dram_read") or 0.0 for k in rows) / iters,
        dram_write=sum(k.get("dram_write") or 0.0 for k in rows) / iters,
        l2_bytes=l2,
        duration_ns=duration,
        n_kernels=per_call,
        bytes_ratio=dram / model_bytes if model_bytes else None,
        dram_gbps=dram / duration if duration else None,
        model_gbps=model_bytes / duration if duration else None,
        tflops=model_flops / duration / 1e3 if duration else None,
    )
    for k in rows[:per_call]:
        bound, line = verdict(k)
        out["kernels"].append(
            {
                "name": k.name,
                "short_name": k.short_name(),
                "duration_ns": k.duration_ns,
                "dram_read": k.get("dram_read"),
                "dram_write": k.get("dram_write"),
                "dram_bytes": k.dram_bytes,
                "bytes_ratio": k.dram_bytes / model_bytes if model_bytes else None,
                "l2_bytes": k.get("l2_bytes"),
                "dram_pct": k.get("dram_pct"),
                "l2_pct": k.get("l2_pct"),
                "sm_pct": k.get("sm_pct"),
                "occupancy_pct": k.get("occupancy_pct"),
                "theoretical_occupancy_pct": k.get("theoretical_occupancy_pct"),
                "occupancy_limiter": k.occupancy_limiter(),
                "registers": k.get("registers"),
                "shared_mem_bytes": (k.get("smem_static") or 0.0) + (k.get("smem_dynamic") or 0.0),
                "block_size": k.get("block_size"),
                "grid_size": k.get("grid_size"),
                "waves": k.get("waves"),
                "stalls": k.stalls()[:3],
                "tensor_pct": k.tensor_pct(),
                "fma_pct": k.fma_pct(),
                "bound": bound,
                "verdict": line,
            }
        )
    return out


def bytes_line(row: dict) -> str:
    """'DRAM 268 MB (read 134, written 134) = 1.00x the minimum 268 MB; L2 540 MB; 64.1 µs, 4.19 TB/s'."""
    if row.get("error"):
        return f"{row['label']}: {row['error']}"
    ratio = row["bytes_ratio"]
    return (
        f"DRAM {row['dram_bytes'] / 1e6:.4g} MB (read {row['dram_read'] / 1e6:.4g},"
        f" written {row['dram_write'] / 1e6:.4g})"
        f" = {ratio:.2f}x the minimum {row['model_bytes'] / 1e6:.4g} MB; L2 {row['l2_bytes'] / 1e6:.4g} MB;"
        f" {row['n_kernels']} kernel(s), {row['duration_ns'] / 1e3:.4g} µs, {row['dram_gbps']:.4g} GB/s of DRAM,"
        f" {row['tflops']:.3g} TFLOP/s of the model's FLOPs"
    )


@dataclass
class CountersResult:
    """What profile_counters measured: one assessed row per case, where the files are, how ncu was read."""

    rows: list[dict]
    out_dir: Path
    source: str  # "ncu_report" or "csv"

    def text(self) -> str:
        lines = []
        for row in self.rows:
            lines.append(f"{row['label']}: {bytes_line(row) if not row.get('error') else row['error']}")
            for k in row.get("kernels", []):
                lines.append(f"  {k['short_name'][:60]:60s} {k['dram_bytes'] / 1e6:9.4g} MB  {k['verdict']}")
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {"source": self.source, "report": str(self.out_dir / "counters.ncu-rep"), "rows": self.rows}


def profile_counters(
    op: Op | str,
    impls: Iterable[str] | None = None,
    shape: Sequence[int] | None = None,
    dtype: torch.dtype | str = "float32",
    options: dict | None = None,
    *,
    out_dir: str | Path | None = None,
    warmup: int = 2,
    iters: int = 1,
    kernel_regex: str | None = None,
) -> CountersResult:
    """Run `op`'s impls (default: all) at `shape` (default: its first bench shape) under ncu; assess each.

    Raises CountersUnavailable (one line) where counters cannot be read: no GPU, no ncu, not permitted.
    Impls unavailable here (no nvcc, no Triton) come back as rows with their error.
    """
    from fuselab.bench.dtypes import dtype_name, parse_dtype
    from fuselab.ops.registry import get_op

    reason = counters_unavailable("cuda")
    if reason:
        raise CountersUnavailable(reason)
    op = get_op(op) if isinstance(op, str) else op
    names = list(impls) if impls else list(op.impls)
    for name in names:
        op.get_impl(name)
    shape = tuple(shape) if shape is not None else tuple(op.defaults.bench_shapes[0])
    dtype = dtype if isinstance(dtype, str) else dtype_name(dtype)
    dtype = dtype_name(parse_dtype(dtype))
    cases = [Case(op.name, name, shape, dtype, dict(options or {})) for name in names]
    return run_cases(cases, out_dir=out_dir, warmup=warmup, iters=iters, kernel_regex=kernel_regex)


def run_cases(
    cases: Sequence[Case],
    *,
    out_dir: str | Path | None = None,
    warmup: int = 2,
    iters: int = 1,
    kernel_regex: str | None = None,
) -> CountersResult:
    """Profile any cases (of any ops) in one ncu run and assess each; see profile_counters."""
    if warmup < 0 or iters < 1:
        raise ValueError(f"need warmup >= 0 and iters >= 1, got warmup={warmup}, iters={iters}")
    out = Path(out_dir) if out_dir is not None else Path(tempfile.mkdtemp(prefix="fuselab-counters-"))
    kernels, statuses, source = run_ncu(cases, out, warmup=warmup, iters=iters, kernel_regex=kernel_regex)
    groups = split_by_marker(kernels, len(cases))
    errors = [s.get("error") for s in statuses] if len(statuses) == len(cases) else [None] * len(cases)
    rows = [assess_case(c, g, iters, e) for c, g, e in zip(cases, groups, errors, strict=True)]
    result = CountersResult(rows=rows, out_dir=out, source=source)
    (out / "counters.json").write_text(json.dumps(result.to_json(), indent=1, default=str) + "\n")
    return result


# ------------------------------------------------------------------------------------------------ roofline


def roofline_points(rows: Iterable[dict]) -> tuple[list[dict], list[dict]]:
    """(modelled, measured) roofline points per impl: FLOPs over the model's minimum bytes, and over DRAM bytes.

    Both take the impl's summed kernel time under ncu, so the pair differs only in bytes: a point that moves left
    from modelled to measured moves more than the minimum.
    """
    modelled, measured = [], []
    for r in rows:
        if r.get("error") or not r.get("duration_ns") or not r.get("dram_bytes"):
            continue
        base = {
            "label": r["label"],
            "group": f"{r['op']} {r['impl']}",
            "family": r["op"],
            "kind": "matmul" if r.get("bound_model") == "compute" else "elementwise",
            "dtype": r["dtype"],
            "flops": r["model_flops"],
            "median_ms": r["duration_ns"] / 1e6,
        }
        modelled.append({**base, "bytes": r["model_bytes"]})
        measured.append({**base, "bytes": r["dram_bytes"]})
    return modelled, measured


def plot_rooflines(
    rows: Iterable[dict], copy_gbps: float, matmul_tflops: dict[str, float], out: Path, prefix: str = "roofline"
) -> list[Path]:
    """Two roofline charts, modelled bytes and measured DRAM bytes, written as out/{prefix}_{model,dram}.png."""
    from fuselab.studies import roofline

    modelled, measured = roofline_points(rows)
    if not modelled:
        return []
    paths = []
    for name, points, what in (
        ("model", modelled, "the model's minimum bytes"),
        ("dram", measured, "DRAM bytes (ncu)"),
    ):
        placed = roofline.place_all(points, copy_gbps, matmul_tflops)
        title = f"roofline from {what}"
        paths.append(roofline.plot_roofline(placed, copy_gbps, matmul_tflops, out / f"{prefix}_{name}.png", title))
    return paths


def dram_peak_gbps(rows: Iterable[dict]) -> float | None:
    """The DRAM peak (GB/s) ncu measures percentages against, recovered from the busiest kernel: rate / (pct / 100)."""
    best: tuple[float, float] | None = None
    for r in rows:
        for k in r.get("kernels", []):
            pct, dur, moved = k.get("dram_pct"), k.get("duration_ns"), k.get("dram_bytes")
            if pct and dur and moved and pct >= 20 and (best is None or pct > best[0]):
                best = (pct, moved / dur / (pct / 100))
    return best[1] if best else None


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fuselab.profile.counters", description=__doc__)
    parser.add_argument("--child", type=Path, help="(run by ncu) the spec of the cases to run")
    parser.add_argument("--status", type=Path, help="(run by ncu) where the child writes each case's status")
    args = parser.parse_args(argv)
    if args.child is None or args.status is None:
        parser.error("run `fuselab profile OP --counters`; this entry point is the child that ncu starts")
    return _child(args.child, args.status)


if __name__ == "__main__":
    raise SystemExit(_main())

__all__ = [
    "Case",
    "CountersResult",
    "CountersUnavailable",
    "Kernel",
    "assess_case",
    "counters_unavailable",
    "find_ncu",
    "parse_raw_csv",
    "profile_counters",
    "roofline_points",
    "run_cases",
    "split_by_marker",
    "verdict",
]


def ncu_version(ncu: str | None) -> str | None:
    """ncu's version line, e.g. 'Version 2025.3.1.0 (build ...)'; None without ncu."""
    if not ncu:
        return None
    try:
        out = subprocess.run([ncu, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [line.strip() for line in out.splitlines() if "Version" in line]
    return lines[0] if lines else out.strip() or None


def study_shapes(op: Op) -> list[tuple[int, ...]]:
    """A large and a small shape for any op, by rule: the middle bench shape, and it with its first dimension of at
    least 256 (the leading one for gelu and softmax; attention's sequence length, its batch being 1) / 256 + 1."""
    large = tuple(op.defaults.bench_shapes[len(op.defaults.bench_shapes) // 2])
    i = next((i for i, n in enumerate(large) if n >= 256), 0)
    small = (*large[:i], large[i] // 256 + 1, *large[i + 1 :])
    return [large, small]
