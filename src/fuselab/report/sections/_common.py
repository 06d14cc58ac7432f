"""What the sections share: number formatting and results rows slimmed for JSON."""

from __future__ import annotations


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
    """The first line of a message, without the exception's module path."""
    if not text:
        return ""
    line = str(text).strip().splitlines()[0][:200]
    return line.removeprefix("fuselab.ops.evaluate.")


def short_dtype(dtype: str) -> str:
    """fp32, bf16, fp16 for those dtype names; any other name as it is."""
    return {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(dtype, dtype)


_KEEP = (
    "study",
    "axis",
    "value",
    "layers",
    "steps",
    "batch",
    "dim",
    "op",
    "impl",
    "dtype",
    "shape",
    "approximate",
    "n",
    "numel",
    "width",
    "median_ms",
    "iqr_ms",
    "min_ms",
    "reps",
    "mode",
    "flops",
    "bytes",
    "ai",
    "tflops",
    "gbps",
    "pct_copy",
    "pct_copy_same",
    "speedup_vs_torch",
    "rel_err",
    "compile_s",
    "compile_flags",
    "warnings",
    "error",
)


def slim(row: dict) -> dict:
    """A results row without the bulky fields (the JSON-lines logs keep everything)."""
    out = {k: row[k] for k in _KEEP if k in row}
    if row.get("study") != "matmul":
        out.pop("n", None)  # in bench rows `n` counts the repetitions
        if "n" in row:
            out["reps"] = row["n"]
    return out
