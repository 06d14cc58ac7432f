"""Results out: rich tables in the terminal, CSV and JSON files, and plots of a metric against size."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from fuselab.bench.record import Record, as_json, value
from fuselab.bench.shapes import format_shape
from fuselab.bench.timer import CPU_BUSY_FRACTION, NOISY_IQR_FRACTION, is_noisy

Column = tuple[str, str, Callable[[object], str]]  # (field, header, formatter)

NOISY_MARK = "~"
NOISY_LEGEND = (
    f"{NOISY_MARK} noisy: IQR over {100 * NOISY_IQR_FRACTION:.0f}% of the median, or the CPU busy with other work "
    f"(a task waited for a CPU over {100 * CPU_BUSY_FRACTION:.0f}% of the timing) "
    "(rerun with a longer --rep-ms, on a quieter machine)"
)


ABOVE_MARK = "!"  # a share of a ceiling past it (the op layer says which: fuselab.evaluate.past_ceilings)


def fmt_float(digits: int = 3) -> Callable[[object], str]:
    return lambda v: "" if v is None else f"{v:.{digits}g}" if isinstance(v, float) else str(v)


def fmt_fixed(digits: int) -> Callable[[object], str]:
    return lambda v: "" if v is None else f"{v:.{digits}f}" if isinstance(v, int | float) else str(v)


def fmt_rate(v: object) -> str:
    """A rate (GB/s, TFLOP/s) with the decimals its size needs: 4093, 51.2, 3.42, 0.0412."""
    if v is None:
        return ""
    if not isinstance(v, int | float):
        return str(v)
    size = abs(v)
    if size >= 100 or size == 0:
        return f"{v:.0f}"
    if size >= 10:
        return f"{v:.1f}"
    if size >= 1:
        return f"{v:.2f}"
    return f"{v:.3g}"


def row_is_noisy(record: Record) -> bool:
    """A measured row whose IQR is over NOISY_IQR_FRACTION of its median, or timed while the CPU was busy."""
    if value(record, "error"):
        return False
    busy = value(record, "cpu_busy")
    median, iqr = value(record, "median_ms"), value(record, "iqr_ms")
    return is_noisy(median, iqr) or (busy is not None and busy > CPU_BUSY_FRACTION)  # type: ignore[operator, arg-type]


def busy_line(records: Sequence[Record]) -> str | None:
    """One line saying how many of the measured records were timed while the CPU was busy with other work, and what
    that does to them (None where none was)."""
    measured = [r for r in records if not value(r, "error") and value(r, "median_ms") is not None]
    shares = [value(r, "cpu_busy") for r in measured]
    busy = [b for b in shares if isinstance(b, int | float) and b > CPU_BUSY_FRACTION]
    if not busy:
        return None
    return (
        f"{len(busy)} of {len(measured)} timings ran while the CPU was busy with other work (some task waited for a "
        f"CPU up to {100 * max(busy):.0f}% of the time): their times are inflated however steady they look; rerun on "
        "a quieter machine"
    )


def fmt_plain(v: object) -> str:
    if v is None:
        return ""
    if isinstance(v, list | tuple) and all(isinstance(x, int) for x in v):
        return format_shape(tuple(v))
    if isinstance(v, list | tuple):
        return ", ".join(str(x) for x in v)
    return str(v)


def make_table(
    records: Sequence[Record],
    columns: Sequence[Column],
    title: str = "",
    *,
    mark_noisy: str | None = None,
    marks: Mapping[str, Callable[[Record], str]] | None = None,
) -> Table:
    """A rich Table of the given columns; a row with an error shows its first line in place of the measurements.

    mark_noisy: the field (e.g. "median_ms") whose cell gets NOISY_MARK when the row is noisy (see row_is_noisy).
    marks: {field: mark(record)}, what else a cell of that field gets after its value ("" for nothing; e.g.
    ABOVE_MARK where a share passes its ceiling).
    Cells do not wrap (a dtype stays "bfloat16", not "bfloat1/6"); print it with print_table, which widens the
    console to the table when the output is not a terminal.
    """
    table = Table(title=title or None, header_style="bold")
    for _, header, _ in columns:
        table.add_column(header, no_wrap=True)
    for record in records:
        if value(record, "error"):
            cells = [fmt(value(record, field)) for field, _, fmt in columns[:3]]
            status = value(record, "status") or "error"
            cells.append(f"[red]{status}: {first_line(value(record, 'error'))[:100]}[/red]")
            cells += [""] * (len(columns) - len(cells))
            table.add_row(*cells[: len(columns)])
        else:
            cells = []
            for field, _, fmt in columns:
                cell = fmt(value(record, field))
                if field == mark_noisy and cell and row_is_noisy(record):
                    cell += NOISY_MARK
                if cell and marks and field in marks:
                    cell += marks[field](record)
                cells.append(cell)
            table.add_row(*cells)
    return table


def first_line(text: object) -> str:
    """The first line of an error message ('' for None)."""
    return (str(text).strip().splitlines() or [""])[0] if text is not None else ""


def print_table(table: Table, console: Console | None = None) -> None:
    """Print a table whole: at a terminal rich fits it to the width; to a file or a pipe (80 columns by default) the
    console is widened to the table's natural width, so no cell is folded."""
    console = console or Console()
    if not console.is_terminal:
        width = Measurement.get(console, console.options.update_width(10_000), table).maximum
        if width > console.width:
            console = Console(file=console.file, width=width, highlight=False, no_color=console.no_color)
    console.print(table)


def write_json(records: Sequence[Record], path: str | Path, meta: dict | None = None) -> Path:
    """{"meta": ..., "records": [...]} with indentation, for committing."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"meta": meta or {}, "records": [as_json(r) for r in records]}
    path.write_text(json.dumps(body, indent=1, default=str) + "\n")
    return path


def write_csv(records: Sequence[Record], path: str | Path) -> Path:
    """Flat columns; nested values (lists, dicts) are written as JSON."""
    records = [as_json(r) for r in records]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fields: list[str] = []
    for record in records:
        fields += [k for k in record if k not in fields]
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        for record in records:
            writer.writerow({k: json.dumps(v) if isinstance(v, list | dict) else v for k, v in record.items()})
    return path


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (files only, no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: str | Path, dpi: int = 120) -> Path:
    """Lay out, save (creating the folder), close; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    return path


def plot_metric(
    records: Iterable[Record],
    path: str | Path,
    *,
    x: str,
    y: str,
    series: str = "impl",
    panel: str | None = "dtype",
    ceiling: float | Callable[[list[Record]], float | None] | None = None,
    ceiling_label: str = "copy ceiling",
    xlabel: str | None = None,
    ylabel: str | None = None,
    title: str = "",
    logx: bool = True,
    logy: bool = False,
) -> Path:
    """One line per `series` value of `y` against `x`, one panel per `panel` value; failed rows are left out.
    ceiling: a level drawn on every panel, or a function of a panel's rows giving its own."""
    plt = pyplot()
    rows = [r for r in records if not value(r, "error") and value(r, y) is not None and value(r, x) is not None]
    panels = sorted({str(value(r, panel)) for r in rows}) if panel else [""]
    cols = min(4, max(1, len(panels)))  # panels wrap onto rows of at most four
    nrows = -(-max(1, len(panels)) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(6 * cols, 4.2 * nrows), squeeze=False)
    for ax in axes.flat[len(panels or [""]) :]:
        ax.set_visible(False)
    for ax, name in zip(axes.flat, panels or [""], strict=False):
        mine = [r for r in rows if not panel or str(value(r, panel)) == name]
        for label in sorted({str(value(r, series)) for r in mine}):
            points = sorted((value(r, x), value(r, y)) for r in mine if str(value(r, series)) == label)
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
        level = ceiling(mine) if callable(ceiling) else ceiling  # a function: each panel's own (its dtype's peak)
        if level:
            ax.axhline(level, color="black", linestyle="--", linewidth=1, label=ceiling_label)
        if logx:
            ax.set_xscale("log", base=2)
        if logy:
            ax.set_yscale("log")
        ax.set_xlabel(xlabel or x)
        ax.set_ylabel(ylabel or y)
        ax.set_title(f"{title} {name}".strip())
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    return save_figure(fig, path)
