"""The section runner with small made-up sections: resume, failures, --fresh, --only, rendering."""

import json

import pytest

from fuselab.report.doc import blocks_to_html, blocks_to_markdown, inline_html, text_html
from fuselab.report.runner import Context, Section, run_report


def make_sections(calls: list[str], fail: set[str] = frozenset()) -> list[Section]:
    def section(name: str):
        def fn(ctx, doc):
            calls.append(name)
            if name in fail:
                raise RuntimeError(f"{name} broke on purpose")
            doc.text(f"**{name}** says `hello` & <bye>")
            doc.table(["k", "v"], [[name, 1], ["pipe|cell", None]])
            return {"value": len(name), "seen": sorted(ctx.results)}

        return fn

    return [Section(n, n.upper(), section(n)) for n in ("alpha", "beta", "gamma")]


def context(tmp_path, mode="quick"):
    return Context(out=tmp_path, device="cpu", mode=mode, budget={}, show_progress=False)


def test_each_section_is_saved_and_later_sections_see_earlier_results(tmp_path):
    calls = []
    records = run_report(make_sections(calls), context(tmp_path))
    assert calls == ["alpha", "beta", "gamma"]
    saved = json.loads((tmp_path / "results" / "gamma.json").read_text())
    assert saved["status"] == "ok" and saved["results"] == {"value": 5, "seen": ["alpha", "beta"]}
    assert records["beta"]["results"]["value"] == 4
    summary = json.loads((tmp_path / "results.json").read_text())
    assert set(summary["sections"]) == {"alpha", "beta", "gamma"}


def test_a_failing_section_is_reported_and_the_rest_goes_on(tmp_path):
    calls = []
    records = run_report(make_sections(calls, fail={"beta"}), context(tmp_path))
    assert calls == ["alpha", "beta", "gamma"]
    assert records["beta"]["status"] == "failed"
    assert "beta broke on purpose" in records["beta"]["error"]
    assert "RuntimeError" in records["beta"]["traceback"]
    assert records["gamma"]["status"] == "ok"
    md = (tmp_path / "report.md").read_text()
    assert "**This section failed**" in md and "beta broke on purpose" in md
    html = (tmp_path / "report.html").read_text()
    assert '<section id="sec-beta" class="failed">' in html
    assert "(failed)" in html  # in the table of contents


def test_a_rerun_resumes_and_retries_only_what_failed(tmp_path):
    calls = []
    run_report(make_sections(calls, fail={"beta"}), context(tmp_path))
    first = json.loads((tmp_path / "results" / "alpha.json").read_text())["finished"]
    calls.clear()
    records = run_report(make_sections(calls), context(tmp_path))
    assert calls == ["beta"]  # alpha and gamma finished before: resumed, not rerun
    assert records["beta"]["status"] == "ok"
    assert records["alpha"]["finished"] == first
    calls.clear()
    run_report(make_sections(calls), context(tmp_path))
    assert calls == []


def test_fresh_only_and_a_change_of_mode_rerun(tmp_path):
    calls = []
    run_report(make_sections(calls), context(tmp_path))
    calls.clear()
    run_report(make_sections(calls), context(tmp_path), fresh=True, only=["gamma"])
    assert calls == ["gamma"]
    calls.clear()
    run_report(make_sections(calls), context(tmp_path, mode="cpu"))
    assert calls == ["alpha", "beta", "gamma"]  # results of another mode are not reused
    with pytest.raises(ValueError, match="unknown section"):
        run_report(make_sections(calls), context(tmp_path), only=["delta"])


def test_derived_sections_are_always_redone(tmp_path):
    calls = []
    sections = [*make_sections(calls), Section("sum", "SUM", lambda ctx, doc: calls.append("sum") or {}, derived=True)]
    run_report(sections, context(tmp_path))
    calls.clear()
    run_report(sections, context(tmp_path))
    assert calls == ["sum"]


def test_markdown_tables_escape_pipes_and_html_escapes_text():
    md = blocks_to_markdown([{"kind": "table", "headers": ["a"], "rows": [["x|y"]], "caption": ""}])
    assert "x\\|y" in md
    assert inline_html("**b** `c` & <d> [l](http://x)") == (
        '<strong>b</strong> <code>c</code> &amp; &lt;d&gt; <a href="http://x">l</a>'
    )
    assert text_html("- one\n- two").replace("\n", "") == "<ul><li>one</li><li>two</li></ul>"
    assert text_html("### Title\n\nbody") == "<h3>Title</h3>\n<p>body</p>"


def test_html_renders_tables_and_code_in_text_folds_and_embeds(tmp_path):
    """Markdown inside text (a table, a fenced block holding backticks) is rendered, not shown as pipes; folded
    tables and code collapse into <details>; a cell's pipe stays in its cell; raw HTML is escaped."""
    blocks = [
        {"kind": "text", "text": "Q5:\n\n| w | x |\n|---|---|\n| 128 | **3×** |\n\n```cuda\nint i = 0;\n```"},
        {"kind": "table", "headers": ["a", "b"], "rows": [["x|y", "<b>"]], "caption": "every *timing*", "folded": True},
        {"kind": "code", "text": "uses ``` inside", "caption": "log", "folded": False},
    ]
    page = blocks_to_html(blocks, tmp_path)
    assert "<td>128</td>" in page and "<strong>3×</strong>" in page
    assert '<pre><code class="language-cuda">int i = 0;' in page
    assert "<details><summary>every <em>timing</em></summary><table>" in page
    assert "<td>x|y</td>" in page and "<td>&lt;b&gt;</td>" in page
    assert '<p class="caption">log</p><pre><code>uses ``` inside' in page
    md = blocks_to_markdown(blocks)
    assert "````\nuses ``` inside\n````" in md  # a fence longer than the backticks inside


def test_images_link_relative_to_the_report_even_when_out_is_a_relative_path(tmp_path, monkeypatch):
    """`fuselab report --out some/dir`: report.md links plots/x.png, and report.html embeds the image."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def plotting(ctx, doc):
        path = ctx.plot("x.png")
        plt.figure(figsize=(1, 1))
        plt.savefig(path)
        plt.close()
        doc.image(path, "a plot")
        return {}

    monkeypatch.chdir(tmp_path)
    out = tmp_path / "some" / "dir"
    ctx = Context(out=out.relative_to(tmp_path), device="cpu", mode="quick", budget={}, show_progress=False)
    run_report([Section("p", "P", plotting)], ctx)
    assert "](plots/x.png)" in (out / "report.md").read_text()
    page = (out / "report.html").read_text()
    assert "data:image/png;base64," in page and "image missing" not in page


def test_each_section_records_what_measured_it_and_a_resumed_one_of_another_revision_is_named(tmp_path, monkeypatch):
    """results/<name>.json carries the revision, host, threads, clocks and time of the run that made it; the report
    names the sections it shows from another revision than its own."""
    monkeypatch.setenv("FUSELAB_REVISION", "1111111aaaaaaa")
    run_report(make_sections([]), context(tmp_path))
    saved = json.loads((tmp_path / "results" / "alpha.json").read_text())
    assert saved["env"]["revision"] == "1111111aaaaaaa" and saved["env"]["threads"] >= 1
    assert {"host", "written", "clocks", "torch", "triton", "cuda", "gpu"} <= set(saved["env"])
    assert "another revision" not in (tmp_path / "report.md").read_text()
    monkeypatch.setenv("FUSELAB_REVISION", "2222222bbbbbbb")
    run_report(make_sections([]), context(tmp_path), fresh=True, only=["beta"])
    md = (tmp_path / "report.md").read_text()
    assert "ALPHA, GAMMA: resumed from another revision (1111111aaaaa)" in md
