"""What the sections share: number formatting and results rows slimmed for JSON."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from fuselab.ops.registry import Op, all_ops
from fuselab.report.doc import Doc


def g3(value: float | None, unit: str = "") -> str:
    """Three significant digits (thousands plain), with a unit; empty for None."""
    if value is None:
        return ""
    text = f"{value:.0f}" if abs(value) >= 1000 else f"{value:.3g}"
    return f"{text} {unit}".strip()


def ms(value: float | None) -> str:
    """A time given in ms, shown in µs below 1 ms."""
    if value is None:
        return ""
    return f"{value * 1e3:.3g} µs" if value < 1 else f"{value:.4g} ms"


def pow2(n: int) -> str:
    """2^k for powers of two (from 2^10), else the number."""
    return f"2^{n.bit_length() - 1}" if n >= 1024 and n & (n - 1) == 0 else str(n)


def first_line(text: object) -> str:
    """The first line of a message, without an exception's module path ("fuselab.bench.sweep.Unavailable: ..." of
    older logs: "fuselab.ops.evaluate.")."""
    if not text:
        return ""
    line = str(text).strip().splitlines()[0][:200]
    return re.sub(r"^fuselab(\.[a-z_]+)+\.(?=[A-Z])", "", line)


_DROP = (
    "key",
    "device",
    "gpu",
    "torch",
    "triton",
    "mean_ms",
    "max_ms",
    "host_ms",
    "flushed_l2",
    "l2_flush",
    "rounds",
    "copy_same_gbps",
    "compile_graphs",
)


def slim(row: dict) -> dict:
    """A results row without the bulky or repeated fields (the JSON-lines logs keep everything)."""
    out = {k: v for k, v in row.items() if k not in _DROP}
    if "n" in out:
        out["reps"] = out.pop("n")  # in bench rows `n` counts the repetitions
    return out


def each_op(ops: Sequence[Op] | None, one_op: Callable[[Op], dict], doc: Doc) -> dict[str, dict]:
    """{op name: one_op(op)} for `ops` (None: every registered op), each under a heading of its own in `doc`."""
    results = {}
    for op in list(ops) if ops is not None else all_ops():
        doc.text(f"### {op.title} (`{op.name}`)")
        results[op.name] = one_op(op)
    return results
