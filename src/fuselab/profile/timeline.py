"""A timeline picture of a trace: the Nsight Systems view, without Nsight.

Rows, top to bottom: for each CPU thread its ranges (fuselab.profile.range, record_function), its PyTorch
operators (nested ones below their caller) and its CUDA API calls (launches grey, synchronizations red);
then the ranges as seen on the GPU and each GPU stream's kernels (one color per kernel name), copies and
memsets. Thin grey lines join a launch to the start of its kernel: when they lean far to the right, the CPU
is running ahead of the GPU. Red dashed lines mark where the CPU waited for the GPU (synchronize calls,
device-to-host copies). Time is in milliseconds from the start of the trace.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from fuselab.profile.table import short_kernel_name
from fuselab.profile.trace import Event, Lane, Trace

MAX_DEPTH = 4  # nested rows shown per lane
COLORS = {
    "range": "#8c6bb1",
    "gpu_range": "#bcaad6",
    "cpu": "#4c72b0",
    "launch": "#9a9a9a",
    "api": "#cfcfcf",
    "sync": "#d62728",
    "memcpy": "#ff7f0e",
    "memset": "#bcbd22",
}
_KERNEL_PALETTE = plt.get_cmap("tab20").colors


def kernel_color(name: str) -> tuple[float, ...]:
    """The same kernel gets the same color in every picture."""
    return _KERNEL_PALETTE[zlib.crc32(short_kernel_name(name).encode()) % len(_KERNEL_PALETTE)]


def _color(lane: Lane, e: Event) -> object:
    if lane.kind == "gpu":
        return kernel_color(e.name) if e.kind == "kernel" else COLORS[e.kind]
    if lane.kind == "api":
        return COLORS[e.kind] if e.kind in COLORS else COLORS["api"]
    return COLORS[lane.kind]


def render_timeline(
    trace: Trace,
    path: str | Path,
    *,
    title: str | None = None,
    window_ms: tuple[float, float] | None = None,
    max_flows: int = 400,
    width_in: float = 16.0,
) -> Path:
    """Draw `trace` into a PNG at `path` and return the path.

    window_ms: (start, end) in ms from the start of the trace, to zoom in; default the whole trace.
    max_flows: draw at most this many launch-to-kernel lines (evenly picked).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lanes = trace.lanes()
    t0 = trace.start

    def ms(ts: float) -> float:
        return (ts - t0) / 1000.0

    lo, hi = window_ms if window_ms else (0.0, max(ms(trace.end), 1e-3))
    if hi <= lo:
        raise ValueError(f"empty time window {window_ms}")

    # lane geometry: y grows downward; each lane has rows for nesting depth
    heights = [min(max((d for _, d in lane.events), default=0) + 1, MAX_DEPTH) for lane in lanes]
    tops, y = [], 0.0
    for h in heights:
        tops.append(y)
        y += h + 0.6
    total = max(y, 1.0)
    fig, ax = plt.subplots(figsize=(width_in, 1.2 + 0.32 * total))
    span = hi - lo
    chars_across = (width_in - 1.8) * 72 / (7 * 0.8)  # 7-point characters (generously wide) across the plot

    centers: dict[str, float] = {}
    for lane, top in zip(lanes, tops, strict=True):
        centers[lane.label] = top + 0.5
        bars: dict[object, list[tuple[float, float, float]]] = {}
        for e, depth in lane.events:
            if depth >= MAX_DEPTH or ms(e.end) < lo or ms(e.ts) > hi:
                continue
            bars.setdefault(_color(lane, e), []).append((ms(e.ts), max(e.dur / 1000.0, span * 2e-4), top + depth))
            fits = int((min(ms(e.end), hi) - max(ms(e.ts), lo)) / span * chars_across)  # label characters that fit
            if fits >= 5 and lane.kind != "api":
                label = short_kernel_name(e.name) if lane.kind == "gpu" else e.name
                label = label if len(label) <= fits else label[: fits - 1] + "…"
                x = max(ms(e.ts), lo) + span * 0.002
                ax.text(x, top + depth + 0.5, label, va="center", ha="left", fontsize=7, clip_on=True)
        for color, items in bars.items():
            for row in sorted({r for _, _, r in items}):
                # a thin white edge keeps back-to-back bars apart; on narrow bars it would wash the color out
                for wide in (True, False):
                    spans = [(x, w) for x, w, r in items if r == row and (w > span / 300) == wide]
                    if spans:
                        edge = {"edgecolors": "white", "linewidth": 0.3} if wide else {"linewidth": 0}
                        ax.broken_barh(spans, (row + 0.08, 0.84), facecolors=color, **edge)

    # launch -> kernel lines (CPU runs ahead when they lean right)
    api_lane = {lane.label: lane for lane in lanes if lane.kind == "api"}
    pairs = trace.launches()
    if pairs and api_lane:
        step = max(1, len(pairs) // max_flows)
        api_y = {e: centers[lbl] for lbl, lane in api_lane.items() for e, _ in lane.events}
        gpu_y = {e: centers[lane.label] for lane in lanes if lane.kind == "gpu" for e, _ in lane.events}
        for launch, work in pairs[::step]:
            if launch in api_y and work in gpu_y:
                ax.plot([ms(launch.ts), ms(work.ts)], [api_y[launch], gpu_y[work]], color="0.45", lw=0.4, alpha=0.35)

    syncs = trace.syncs()
    for s in syncs:
        ax.axvline(ms(s.ts), color=COLORS["sync"], lw=0.8, ls="--", alpha=0.6)

    ax.set_yticks(
        [top + h / 2 for top, h in zip(tops, heights, strict=True)], [lane.label for lane in lanes], fontsize=8
    )
    ax.set_ylim(total, -0.4)
    ax.set_xlim(lo, hi)
    ax.set_xlabel("time (ms from the start of the trace)")
    ax.grid(axis="x", color="0.9", lw=0.6)
    ax.set_axisbelow(True)
    kinds_present = {lane.kind for lane in lanes}
    legend = [Patch(color=COLORS[k], label=n) for k, n in (("range", "range"), ("cpu", "CPU op")) if k in kinds_present]
    if "api" in kinds_present:
        legend += [
            Patch(color=COLORS["launch"], label="launch / copy call"),
            Patch(color=COLORS["sync"], label="sync call"),
        ]
    if "gpu" in kinds_present:
        legend += [
            Patch(color=_KERNEL_PALETTE[0], label="kernel (color by name)"),
            Patch(color=COLORS["memcpy"], label="memcpy"),
        ]
    if syncs:
        legend.append(Line2D([], [], color=COLORS["sync"], ls="--", label=f"CPU waits for GPU ({len(syncs)})"))
    if pairs:
        legend.append(Line2D([], [], color="0.45", lw=0.8, label="launch → kernel start"))
    note = "" if trace.has_gpu else " (no GPU in this trace: CPU lanes only)"
    ax.set_title((title or (trace.path.name if trace.path else "timeline")) + note, fontsize=10, loc="left")
    bottom = 0.0
    if legend:
        fig.legend(handles=legend, loc="lower center", ncol=len(legend), fontsize=7, frameon=False)
        bottom = 0.35 / fig.get_figheight()
    fig.tight_layout(rect=(0, bottom, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
