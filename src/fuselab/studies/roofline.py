"""The roofline: each measured kernel placed by arithmetic intensity against the device's measured ceilings.

A kernel doing F FLOPs while moving B bytes (the fewest it must) has arithmetic intensity AI = F / B FLOP/byte.
On a device with bandwidth W (GB/s) and compute peak P (TFLOP/s) it can reach at most min(P, AI · W) — the
memory roof left of the ridge point AI = P / W, the compute roof right of it. W is the measured copy bandwidth
and P the measured matmul rate of the kernel's dtype (for kernels that are not matmuls, the fp32 matmul rate
stands in for the plain-core compute roof).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from fuselab.bench.dtypes import short_name
from fuselab.bench.results import pyplot, save_figure

_PEAK_OF = {"fp16": "bf16"}  # fp16 runs at the bf16 rate on the tensor cores: held against bf16's measured peak


def attainable_tflops(ai: float, copy_gbps: float, peak_tflops: float) -> float:
    """The roof at arithmetic intensity `ai` (FLOP/byte): min(peak, ai · bandwidth), in TFLOP/s."""
    if ai < 0 or copy_gbps <= 0 or peak_tflops <= 0:
        raise ValueError(f"need ai >= 0 and positive ceilings, got ai={ai}, {copy_gbps} GB/s, {peak_tflops} TFLOP/s")
    return min(peak_tflops, ai * copy_gbps / 1e3)


def ridge_point(copy_gbps: float, peak_tflops: float) -> float:
    """FLOP/byte where the memory roof meets the compute roof: peak / bandwidth."""
    return peak_tflops * 1e3 / copy_gbps


def peak_for(dtype: str, kind: str, matmul_tflops: dict[str, float]) -> tuple[str, float]:
    """(name, TFLOP/s) of the compute roof a kernel of `kind` ("matmul" or other) in `dtype` is held against: a
    matmul-like kernel's dtype's own (fp16: bf16's), or fp32's where that is faster (16-bit data can be multiplied
    in fp32: a CPU without bf16 units), or fp32's where its own was not measured; any other kernel fp32's."""
    short = short_name(dtype)
    name = _PEAK_OF.get(short, short) if kind == "matmul" else "fp32"
    if name not in matmul_tflops or matmul_tflops[name] < matmul_tflops.get("fp32", 0.0):
        name = "fp32"
    return name, matmul_tflops[name]


@dataclass(frozen=True)
class Point:
    """One measured kernel to place: its label, group (one colour in the plot; None: its label), family (its
    marker), kind ("matmul": held against its dtype's matmul rate, else fp32's), dtype, FLOPs, the fewest bytes it
    must move, and its median time."""

    label: str
    flops: float
    bytes: float
    median_ms: float
    dtype: str = "float32"
    kind: str = ""
    family: str = ""
    group: str | None = None

    def to_json(self) -> dict[str, object]:
        order = ("label", "group", "family", "kind", "dtype", "flops", "bytes", "median_ms")  # as results hold them
        return {name: getattr(self, name) for name in order}


@dataclass(frozen=True)
class Placed:
    """A Point on the roofline: its ai (FLOP/byte), achieved tflops and gbps, the compute roof it is held against
    (peak, peak_tflops) and that roof's ridge point (ridge_ai), the roof at its ai (roof_tflops), pct_of_roof
    (achieved / roof, %) and bound: "memory" left of the ridge point, "compute" right of it."""

    point: Point
    ai: float
    tflops: float
    gbps: float
    peak: str
    peak_tflops: float
    ridge_ai: float
    roof_tflops: float
    pct_of_roof: float | None
    bound: str

    def to_json(self) -> dict[str, object]:
        """The flat JSON form the report's results hold: the point's fields, then the placement's."""
        placed = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "point"}
        return {**self.point.to_json(), **placed}


def place(point: Point, copy_gbps: float, matmul_tflops: dict[str, float]) -> Placed:
    """One kernel on the roofline (`Placed`)."""
    seconds = point.median_ms * 1e-3
    if seconds <= 0 or point.bytes <= 0:
        raise ValueError(f"cannot place {point.label!r}: needs positive time and bytes")
    ai = point.flops / point.bytes
    peak_name, peak = peak_for(point.dtype, point.kind, matmul_tflops)
    roof = attainable_tflops(ai, copy_gbps, peak)
    tflops = point.flops / seconds / 1e12
    ridge = ridge_point(copy_gbps, peak)
    return Placed(
        point=point,
        ai=ai,
        tflops=tflops,
        gbps=point.bytes / seconds / 1e9,
        peak=peak_name,
        peak_tflops=peak,
        ridge_ai=ridge,
        roof_tflops=roof,
        pct_of_roof=100 * tflops / roof if roof > 0 else None,
        bound="memory" if ai < ridge else "compute",
    )


def place_all(points: Iterable[Point], copy_gbps: float, matmul_tflops: dict[str, float]) -> list[Placed]:
    return [place(p, copy_gbps, matmul_tflops) for p in points]


def plot_roofline(
    placed: Sequence[Placed], copy_gbps: float, matmul_tflops: dict[str, float], path: str | Path, title: str = ""
) -> Path:
    """Log-log chart: the memory roof, one compute roof per measured matmul dtype, each kernel a marker."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(12, 6.5))
    ais = [p.ai for p in placed] or [1.0]
    lo, hi = (
        min(min(ais) / 4, 0.05),
        max(max(ais) * 4, 4 * max(ridge_point(copy_gbps, p) for p in matmul_tflops.values())),
    )
    styles = {"fp32": "-", "tf32": "-.", "bf16": "--"}
    for name, peak in sorted(matmul_tflops.items(), key=lambda kv: kv[1]):
        ridge = ridge_point(copy_gbps, peak)
        xs = [lo, ridge, hi]
        ax.plot(
            xs,
            [attainable_tflops(x, copy_gbps, peak) for x in xs],
            color="black",
            linewidth=1.2,
            linestyle=styles.get(name, ":"),
            label=f"roof {name}: {peak:.3g} TFLOP/s, {copy_gbps:.0f} GB/s",
        )
    families = sorted({p.point.family for p in placed} - {"matmul"})
    markers = {"matmul": "s", **{f: "o^vD<>ph*"[i % 9] for i, f in enumerate(families)}}
    groups: dict[str, list[Placed]] = {}
    for p in placed:
        groups.setdefault(p.point.group or p.point.label, []).append(p)
    cmap = plt.get_cmap("tab20")
    for i, (group, members) in enumerate(sorted(groups.items())):
        ax.scatter(
            [m.ai for m in members],
            [m.tflops for m in members],
            s=36,
            color=cmap(i % 20),
            marker=markers.get(members[0].point.family, "D"),
            label=group,
            zorder=3,
            edgecolors="black",
            linewidths=0.4,
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_xlabel("arithmetic intensity (FLOP / byte moved)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.set_title(title or "roofline (measured ceilings)")
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), ncol=1 if len(groups) < 18 else 2)
    return save_figure(fig, path)
