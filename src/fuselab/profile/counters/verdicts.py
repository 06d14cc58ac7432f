"""Reading a kernel: its counters by role (Kernel), its verdict (memory-, compute- or latency-bound), the kernels
per case (split_by_marker), and a case's kernels held against its op's cost model (assess_case, bytes_line)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from fuselab.profile.counters.child import Case
from fuselab.profile.counters.ncu import MARKER, NOT_STALLS, PIPE, ROLES, STALL

BOUND_PCT = 60.0  # a unit at or above this share of its peak is what bounds the kernel (ncu's own rule of thumb)


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
    cost_options = {**options, "backward": True} if case.backward else options  # as `fuselab bench --backward`
    model_bytes, model_flops = op.case_cost(case.shape, dtype, cost_options)
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
