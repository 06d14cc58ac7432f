"""Rooflines from counters: each impl placed by the model's minimum bytes and by its measured DRAM bytes."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fuselab.studies.roofline import Point

# ------------------------------------------------------------------------------------------------ roofline


def roofline_points(rows: Iterable[dict]) -> tuple[list[Point], list[Point]]:
    """(modelled, measured) roofline points per impl: FLOPs over the model's minimum bytes, and over DRAM bytes.

    Both take the impl's summed kernel time under ncu, so the pair differs only in bytes: a point that moves left
    from modelled to measured moves more than the minimum.
    """
    from fuselab.studies.roofline import Point

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
        modelled.append(Point(**base, bytes=r["model_bytes"]))
        measured.append(Point(**base, bytes=r["dram_bytes"]))
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
