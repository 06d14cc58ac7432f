"""Nsight Compute itself: finding ncu and its Python module, the command line, running it, reading its report.

The report is read through `ncu_report` when it imports, else from the raw CSV export (parse_raw_csv); the metric
names read (ROLES, STALL, PIPE) and the range and marker the child launches in (RANGE, MARKER) live here.
"""

from __future__ import annotations

import csv
import glob
import io
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fuselab.profile.counters.child import Case

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
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[3]), os.environ.get("PYTHONPATH", "")]),
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
