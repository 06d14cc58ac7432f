"""An op's report section as a reader sees it: a rate past its ceiling is flagged in every table that shows it."""

import json

import pytest

from fuselab.bench import ceilings
from fuselab.evaluate import ABOVE_PEAK_NOTE, Selection, bench_op
from fuselab.ops import get_op
from fuselab.report.doc import Doc, blocks_to_markdown
from fuselab.report.runner import Context
from fuselab.report.sections.derived import roofline_section
from fuselab.report.sections.ops import _bench_docs, plot_point

LOW = {"copy_gbps": 1e-6, "matmul_tflops": {"fp32": 1e-9}}  # far below what any CPU does


@pytest.fixture
def past_the_peak(tmp_path, monkeypatch):
    """A real CPU timing of attention (sdpa) set against cached ceilings far below it, and a report context."""
    monkeypatch.setenv("FUSELAB_CACHE", str(tmp_path / "cache"))
    path = ceilings.cache_dir() / f"{ceilings.cache_key('cpu')}.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({**LOW, "quick": False}))
    op = get_op("attention")
    timing = {"rep_ms": 2, "warmup_ms": 1}
    sdpa = Selection(
        impls=["sdpa"], dtypes=["float32"], shapes=[(1, 2, 64, 32)], options={"causal": False}, device="cpu"
    )
    rows = bench_op(op, sdpa, timing=timing, call_cost_ms=0, show_progress=False)
    ctx = Context(out=tmp_path / "out", device="cpu", mode="quick", budget={}, show_progress=False)
    ctx.results["device"] = dict(LOW)
    return op, rows, ctx


def _table(md: str, caption: str) -> list[list[str]]:
    """The rows (cells) of the Markdown table under the caption that starts with `caption`."""
    lines = md.split(f"*{caption}", 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    table = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        table.append([cell.strip() for cell in line.strip("|").split(" | ")])
    return table


def test_the_op_tables_mark_a_share_past_its_ceiling_and_say_why(past_the_peak):
    """The section's table (time · rate (share)) and its every-timing table (% peak, note) mark the share with '!',
    a line says what that means, and the note keeps the warning however many others the row carries."""
    op, rows, ctx = past_the_peak
    (row,) = rows
    assert row.measured and any(w.endswith(ABOVE_PEAK_NOTE) for w in row.warnings)
    row = row.updated(warnings=("first other warning", "second other warning", *row.warnings))
    doc = Doc(ctx.out)
    _bench_docs(ctx, doc, op, [row], x="axis", xlabel="N")
    md = blocks_to_markdown(doc.blocks)
    header, _, (impl, cell) = _table(md, "attention, float32")
    assert impl == "sdpa" and cell.endswith(f"({row.pct_peak:.0f}%!)")
    assert ABOVE_PEAK_NOTE in md.split("*every timing*")[0]  # the legend, under the first table
    header, _, timing = _table(md, "every timing")
    cells = dict(zip(header, timing, strict=True))
    assert cells["% peak"].endswith("!") and ABOVE_PEAK_NOTE in cells["note"]


def test_the_roofline_table_marks_a_kernel_past_its_roof(past_the_peak):
    op, rows, ctx = past_the_peak
    ctx.results["attention"] = {"bench": [plot_point(op, r) for r in rows], "bound": op.bound}
    doc = Doc(ctx.out)
    placed = roofline_section(ctx, doc)["points"]
    md = blocks_to_markdown(doc.blocks)
    header, _, *table = _table(md, "the smallest and largest size")
    (cells,) = [dict(zip(header, r, strict=True)) for r in table]
    assert placed[0]["pct_of_roof"] > 110 and cells["% of roof"].endswith("!")
    assert "past its roof" in md


def test_the_op_section_says_when_its_timings_ran_on_a_busy_cpu(tmp_path, monkeypatch, busy_cpu):
    """Timed beside matmul processes: the section's table marks the medians '~' and a line says how busy the CPU
    was and that the times are inflated however steady."""
    monkeypatch.setenv("FUSELAB_CACHE", str(tmp_path / "cache"))
    path = ceilings.cache_dir() / f"{ceilings.cache_key('cpu')}.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"copy_gbps": 10.0, "matmul_tflops": {"fp32": 0.1}, "quick": False}))
    op = get_op("softmax")
    chosen = Selection(impls=["torch"], dtypes=["float32"], shapes=[(64, 64)], device="cpu")
    rows = bench_op(op, chosen, timing={"rep_ms": 20, "warmup_ms": 10}, call_cost_ms=0, show_progress=False)
    assert rows[0].cpu_busy > 0.1
    ctx = Context(out=tmp_path / "out", device="cpu", mode="quick", budget={}, show_progress=False)
    ctx.results["device"] = {"copy_gbps": 10.0, "matmul_tflops": {"fp32": 0.1}}
    doc = Doc(ctx.out)
    _bench_docs(ctx, doc, op, rows, x="numel", xlabel="elements")
    md = " ".join(blocks_to_markdown(doc.blocks).split())
    assert "1 of 1 timings ran while the CPU was busy with other work" in md
