"""The quick report, run for real on the CPU: sections, plots, claims, a failing section, resume."""

import dataclasses
import json
import re
import time

import pytest

from fuselab.cli import main
from fuselab.report import run_full_report
from fuselab.report.sections import sections

SECTIONS = sections()

PNG = b"\x89PNG\r\n\x1a\n"
PLOTS = [
    "pitfalls",
    "matmul_time",
    "matmul_tflops",
    "mlp",
    "gelu_gbps",
    "gelu_time",
    "softmax_gbps",
    "every_shape_gelu",
    "every_shape_attention",
    "call_cost_softmax",
    "roofline",
    "runahead_plain",
    "runahead_print",
]


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    start = time.perf_counter()
    records = run_full_report(out, device="cpu", quick=True, show_progress=False)
    return out, records, time.perf_counter() - start


def test_every_section_finishes_quickly(quick):
    _, records, seconds = quick
    failed = {name: r["error"] for name, r in records.items() if r["status"] != "ok"}
    assert failed == {}
    assert list(records) == [s.name for s in SECTIONS]
    assert seconds < 150


def test_markdown_and_html_have_every_section_in_order(quick):
    out, _, _ = quick
    md = (out / "report.md").read_text()
    html = (out / "report.html").read_text()
    positions = [md.index(f"## {s.title}") for s in SECTIONS]
    assert positions == sorted(positions)
    for s in SECTIONS:
        assert f'<section id="sec-{s.name}">' in html
        assert f'href="#sec-{s.name}"' in html  # the table of contents
    assert "| impl \\ elements |" in md  # the GELU table
    assert "`cuda`: " in md  # CUDA C++ listed as unavailable, with its reason


def test_plots_exist_are_linked_and_embedded(quick):
    out, _, _ = quick
    md = (out / "report.md").read_text()
    html = (out / "report.html").read_text()
    for name in PLOTS:
        path = out / "plots" / f"{name}.png"
        assert path.read_bytes()[:8] == PNG, name
        assert f"](plots/{name}.png)" in md
    assert html.count('src="data:image/png;base64,') >= len(PLOTS)
    assert 'src="plots/' not in html  # self-contained


def test_claims_table_has_verdicts_and_the_five_questions(quick):
    out, records, _ = quick
    md = (out / "report.md").read_text()
    claims_md = md[md.index("## Claims reproduced") :]
    assert "| # | claim | measured in this run | criterion | verdict |" in claims_md
    assert re.search(r"✓ held|✗ not held", claims_md)
    for i in range(1, 6):
        assert f"| Q{i} |" in claims_md
    assert md.index("Claims reproduced on this device:") < md.index("## Contents")  # the headline, at the top
    claims = records["claims"]["results"]["claims"]
    measured = [c for c in claims if c["held"] is not None]
    assert len(measured) >= 5  # on the CPU too, most claims get a figure from this run
    assert records["claims"]["results"]["questions"][1]["held"] is not None  # naive GELU vs F.gelu, measured here


def test_results_json_per_section(quick):
    out, _, _ = quick
    for s in SECTIONS:
        saved = json.loads((out / "results" / f"{s.name}.json").read_text())
        assert saved["status"] == "ok" and saved["mode"] == "quick"
    gelu = json.loads((out / "results" / "gelu.json").read_text())["results"]
    assert {r["impl"] for r in gelu["bench"]} >= {"naive", "torch", "compile", "cuda"}
    assert all(r["status"] != "FAIL" for r in gelu["check"])
    assert any(r["impl"] == "triton" and r["status"] == "pass" for r in gelu["check"])  # under the interpreter


def test_a_rerun_resumes_from_the_results_written(quick):
    out, records, _ = quick
    calls = []

    def counting(section):
        def fn(ctx, doc):
            calls.append(section.name)
            return section.fn(ctx, doc)

        return dataclasses.replace(section, fn=fn)

    again = run_full_report(
        out, device="cpu", quick=True, sections=[counting(s) for s in SECTIONS], show_progress=False
    )
    assert calls == ["roofline", "claims"]  # derived from the others, so redone; the rest resumed
    assert again["gelu"]["finished"] == records["gelu"]["finished"]


def test_a_failing_section_is_shown_and_the_rest_goes_on(tmp_path):
    def broken(ctx, doc):
        raise RuntimeError("the matmul study broke on purpose")

    by_name = {s.name: s for s in SECTIONS}
    sections = [by_name["device"], dataclasses.replace(by_name["matmul"], fn=broken), by_name["claims"]]
    records = run_full_report(tmp_path, device="cpu", quick=True, sections=sections, show_progress=False)
    assert records["matmul"]["status"] == "failed"
    assert records["device"]["status"] == "ok" and records["claims"]["status"] == "ok"
    md = (tmp_path / "report.md").read_text()
    assert "**This section failed**" in md and "the matmul study broke on purpose" in md
    assert "section 'matmul' did not finish" in md  # the claims that needed it say why they are n/a
    assert '<section id="sec-matmul" class="failed">' in (tmp_path / "report.html").read_text()


def test_a_second_report_on_the_same_folder_stops_before_writing_and_no_lock_is_left(tmp_path):
    from fuselab.bench.distributed import LogBusy, LogLock

    with LogLock(tmp_path / "report"), pytest.raises(LogBusy, match="being written by another run"):
        run_full_report(tmp_path, device="cpu", quick=True, only=["device"], show_progress=False)
    assert not (tmp_path / "report.md").exists() and not (tmp_path / "results").exists()
    run_full_report(tmp_path, device="cpu", quick=True, only=["device"], show_progress=False)
    assert (tmp_path / "report.md").exists()
    assert list(tmp_path.rglob("*.lock")) == []


def test_cli_report_only_one_section(tmp_path, capsys):
    assert main(["report", "--quick", "--device", "cpu", "--out", str(tmp_path), "--only", "device"]) == 0
    md = (tmp_path / "report.md").read_text()
    assert "copy bandwidth" in md
    assert "*Not run.*" in md  # the other sections
    assert main(["report", "--quick", "--out", str(tmp_path), "--only", "nosuch"]) == 2
    assert "unknown section" in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.first
@pytest.mark.timeout(420)  # ~160-200 s on an H200, two thirds of it in the counters section under ncu
def test_quick_report_on_the_gpu(tmp_path):
    records = run_full_report(tmp_path, device="cuda", quick=True, show_progress=False)
    assert {name: r["error"] for name, r in records.items() if r["status"] != "ok"} == {}
    claims = {c["claim"]: c for c in records["claims"]["results"]["claims"]}
    sync = next(c for text, c in claims.items() if "without synchronize" in text)
    assert sync["held"] is not None  # measured on an asynchronous device
    facts = records["runahead"]["results"]["facts"]
    assert facts["gpu"] and facts["lead_ms"] is not None
    gelu = records["gelu"]["results"]["bench"]
    assert any(r["impl"] == "triton" and not r.get("error") for r in gelu)  # timed on the GPU


def test_a_compute_bound_plot_holds_each_panel_to_its_dtypes_peak(tmp_path):
    """The attention plot's ceiling per panel: fp32 data against the fp32/tf32 peak, bf16 data against bf16's."""
    from fuselab.bench.results import plot_metric
    from fuselab.ops import get_op
    from fuselab.report.runner import Context
    from fuselab.report.sections.ops import _ceiling

    ctx = Context(out=tmp_path, device="cpu", mode="quick", budget={})
    ctx.results["device"] = {"matmul_tflops": {"bf16": 800.0, "tf32": 400.0, "fp32": 50.0}, "copy_gbps": 4000.0}
    level = _ceiling(ctx, get_op("attention"))
    rows = [
        {"dtype": d, "impl": "triton", "x": n, "tflops": 1.0 + n, "panel": d}
        for d in ("float32", "bfloat16")
        for n in (1, 2)
    ]
    assert level([r for r in rows if r["dtype"] == "float32"]) == 400.0
    assert level([r for r in rows if r["dtype"] == "bfloat16"]) == 800.0
    seen = []
    plot_metric(rows, tmp_path / "p.png", x="x", y="tflops", ceiling=lambda mine: seen.append(mine[0]["dtype"]) or 1.0,
                panel="panel")  # fmt: skip
    assert sorted(seen) == ["bfloat16", "float32"] and (tmp_path / "p.png").stat().st_size > 0
    assert _ceiling(ctx, get_op("gelu")) == 4000.0


def test_every_timing_table_names_the_pass_where_both_ran(tmp_path):
    """The H200 report's attention timings listed each shape twice, forward and forward + backward, with nothing to
    tell them apart: the table has a pass column when both passes ran, none when one did."""
    from fuselab.bench.record import Case, Row
    from fuselab.ops import get_op
    from fuselab.report.doc import Doc
    from fuselab.report.sections.ops import _full_table

    case = Case.of("attention", "triton", "bfloat16", (1, 2, 33, 64), {"causal": True})
    both = [Row(case, median_ms=1.0), Row(dataclasses.replace(case, pass_="forward+backward"), median_ms=3.0)]
    doc = Doc(tmp_path)
    _full_table(doc, get_op("attention"), both)
    _full_table(doc, get_op("attention"), both[:1])
    two, one = doc.blocks
    assert two["headers"][3] == "pass" and [r[3] for r in two["rows"]] == ["forward", "forward+backward"]
    assert "pass" not in one["headers"] and len(one["headers"]) == len(two["headers"]) - 1
