"""Reading a figure out of the report's results, for the claims and questions an op or a study answers.

`results` maps a section name to its results (an op's section is named after the op and holds {"bench": rows}).
A figure this run could not measure raises NotMeasured, saying why; the claim is then shown as n/a.
"""

from __future__ import annotations

import statistics

from fuselab.bench.record import Record, Row, value

Results = dict[str, dict]
Finding = tuple[str, float | None, bool | None]  # (figure, value, held)


READ: list[Record] = []  # the rows the claim being evaluated read (so a verdict can say when one is noisy)


def used(*rows: Record) -> None:
    READ.extend(rows)


class NotMeasured(Exception):
    """This run has no figure for a claim; the message says why."""


def section(results: Results, name: str) -> dict:
    if name not in results:
        raise NotMeasured(f"section {name!r} did not finish")
    return results[name]


def ok_rows(rows: list[Record]) -> list[Record]:
    return [r for r in rows if not value(r, "error") and value(r, "median_ms")]


def op_rows(results: Results, op: str) -> list[Row]:
    """The bench Rows of an op's section (its JSON form read back)."""
    return [Row.from_json(r) for r in section(results, op).get("bench", [])]


def _matches(row: Row, dtype: str, match: dict[str, object]) -> bool:
    return (
        row.measured
        and bool(row.median_ms)
        and row.case.dtype == dtype
        and all(row.field(k) == v for k, v in match.items())
    )


def bench_rows(results: Results, op: str, impl: str, *, dtype: str = "float32", **match: object) -> list[Row]:
    """The op's timed rows of impl in dtype whose fields equal `match` (e.g. approximate="tanh")."""
    return [r for r in op_rows(results, op) if r.case.impl == impl and _matches(r, dtype, match)]


def bench_row(results: Results, op: str, impl: str, *, dtype: str = "float32", **match: object) -> Row:
    """The op's bench row for impl and dtype (matching `match`) with the most elements."""
    rows = bench_rows(results, op, impl, dtype=dtype, **match)
    if not rows:
        raise NotMeasured(f"no {op} {impl} {dtype} timing in this run")
    row = max(rows, key=lambda r: r.numel or 0)
    used(row)
    return row


def pairs(rows: list[Row], a: str, b: str, dtype: str = "float32", **match: object) -> list[tuple[Row, Row]]:
    """(row of impl a, row of impl b) at every shape both measured in `dtype` (rows matching `match`)."""
    by = {(r.case.impl, r.case.shape): r for r in rows if _matches(r, dtype, match)}
    found = [(r, by[(b, s)]) for (impl, s), r in by.items() if impl == a and (b, s) in by]
    used(*(r for pair in found for r in pair))
    return found


def median_ratio(found: list[tuple[Row, Row]]) -> float:
    """The median over shapes of time(a) / time(b)."""
    return statistics.median(a.median_ms / b.median_ms for a, b in found)  # type: ignore[operator]


def fmt_x(value: float) -> str:
    return f"{value:.3g}×"


def fmt_gbps(value: float) -> str:
    return f"{value:.0f} GB/s" if value >= 100 else f"{value:.3g} GB/s"


def fmt_ms(value: float) -> str:
    return f"{value * 1e3:.3g} µs" if value < 1 else f"{value:.4g} ms"
