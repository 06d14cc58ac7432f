"""Non-contiguous layouts: each case timed in each layout side by side, and each layout's time held against the
contiguous time plus the copy PyTorch makes (`layout_ratios`)."""

import json

import pytest

from fuselab.bench.record import Case, Row
from fuselab.evaluate import layout_ratios
from fuselab.ops import get_op


def _row(impl: str, shape: tuple[int, ...], layout: str, median_ms: float | None) -> Row:
    return Row(Case.of("softmax", impl, "float32", shape, layout=layout), median_ms=median_ms)


def test_a_layouts_time_is_held_against_its_contiguous_time_plus_what_the_layout_adds_to_torchs():
    """mine: 3.0 sliced against 2.0 contiguous, where torch takes 1.5 more sliced: 3.0 / (2.0 + 1.5); where torch
    takes less on the layout, nothing is added; cases without a contiguous or a torch row are left out."""
    op = get_op("softmax")
    rows = [
        _row("torch", (5, 41), "contiguous", 1.0), _row("torch", (5, 41), "sliced", 2.5),
        _row("mine", (5, 41), "contiguous", 2.0), _row("mine", (5, 41), "sliced", 3.0),
        _row("torch", (7, 29), "contiguous", 1.0), _row("torch", (7, 29), "sliced", 0.8),
        _row("mine", (7, 29), "contiguous", 1.0), _row("mine", (7, 29), "sliced", 1.2),
        _row("mine", (9, 3), "sliced", 1.0), _row("torch", (9, 3), "sliced", 1.0),  # no contiguous row
        _row("mine", (2, 2), "contiguous", 1.0), _row("mine", (2, 2), "sliced", 1.0),  # no torch rows
        _row("mine", (4, 4), "transposed", 5.0), _row("mine", (4, 4), "contiguous", 1.0),
        _row("torch", (4, 4), "transposed", 1.0), _row("torch", (4, 4), "contiguous", None),  # torch not timed
    ]  # fmt: skip
    summaries = {(s["impl"], s["layout"]): s for s in layout_ratios(op, rows)}
    assert set(summaries) == {("torch", "sliced"), ("mine", "sliced")}
    mine = summaries["mine", "sliced"]
    assert mine["shapes"] == 2 and mine["worst"] == pytest.approx(1.2) and mine["dtype"] == "float32"
    assert [w["shape"] for w in mine["worst_shapes"]] == [[7, 29], [5, 41]]
    assert mine["worst_shapes"][1]["ratio"] == pytest.approx(3.0 / 3.5)
    torch_ = summaries["torch", "sliced"]
    assert torch_["worst"] == pytest.approx(1.0) and torch_["worst_shapes"][1]["ratio"] == pytest.approx(0.8)
    assert layout_ratios(op, [r for r in rows if r.case.layout != "contiguous"]) == []


def test_cli_times_each_case_in_each_layout_and_says_how_the_layouts_compare(tmp_path, monkeypatch, capsys):
    """`fuselab bench softmax --layout contiguous --layout sliced` on the CPU: a row per impl, shape and layout, and a
    table (and the JSON's meta `layout_ratios`) of the sliced time over the contiguous time plus torch's copy."""
    from fuselab.bench import ceilings
    from fuselab.cli import main

    monkeypatch.setenv("FUSELAB_CACHE", str(tmp_path))
    path = ceilings.cache_dir() / f"{ceilings.cache_key('cpu')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"copy_gbps": 10.0, "matmul_tflops": {}, "quick": False}))
    args = ["bench", "softmax", "--impl", "torch,naive", "--shape", "5x41", "--shape", "3x37", "--dtype", "fp32"]
    args += ["--device", "cpu", "--rep-ms", "2", "--warmup-ms", "1", "--rounds", "2", "--call-cost-ms", "0"]
    out = tmp_path / "r.json"
    assert main([*args, "--layout", "contiguous", "--layout", "sliced", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    rows = result["records"]
    cases = {(r["impl"], tuple(r["shape"]), r.get("layout", "contiguous")) for r in rows}
    shapes, layouts = ((5, 41), (3, 37)), ("contiguous", "sliced")
    assert cases == {(i, s, lay) for i in ("torch", "naive") for s in shapes for lay in layouts}
    assert len(rows) == 8 and all(r["error"] is None for r in rows)
    laid = {s["impl"]: s for s in result["meta"]["layout_ratios"]}
    assert set(laid) == {"torch", "naive"} and all(s["layout"] == "sliced" and s["shapes"] == 2 for s in laid.values())
    median = {(r["impl"], tuple(r["shape"]), r.get("layout", "contiguous")): r["median_ms"] for r in rows}
    expected = max(
        median["naive", s, "sliced"]
        / (median["naive", s, "contiguous"] + max(0.0, median["torch", s, "sliced"] - median["torch", s, "contiguous"]))
        for s in shapes
    )
    assert laid["naive"]["worst"] == pytest.approx(expected)
    assert "time / (contiguous time + the copy torch makes)" in capsys.readouterr().out


def test_cli_check_checks_each_layout_and_names_it(tmp_path, monkeypatch, capsys):
    """`fuselab check softmax --layout contiguous --layout transposed`: each impl and dtype checked in each layout,
    a row of the table for each, naming its layout; the JSON holds the transposed rows with their layout."""
    from fuselab.cli import main

    monkeypatch.setenv("FUSELAB_CACHE", str(tmp_path))
    out = tmp_path / "c.json"
    args = ["check", "softmax", "--impl", "torch,naive", "--device", "cpu", "--shape", "3x37", "--seed", "4"]
    assert main([*args, "--layout", "contiguous", "--layout", "transposed", "--out", str(out)]) == 0
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("│")]
    assert len(table) == 2 * 3 * 2  # impls x dtypes x layouts
    assert sum("transposed" in line for line in table) == 6 and sum("contiguous" in line for line in table) == 6
    records = json.loads(out.read_text())["records"]
    assert sorted(r.get("layout", "contiguous") for r in records) == ["contiguous"] * 6 + ["transposed"] * 6
