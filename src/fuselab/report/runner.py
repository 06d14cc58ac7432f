"""The section runner: run the report's sections in order, save each as it finishes, resume, render.

A section is a function `fn(ctx, doc) -> dict`: it measures, writes its plots under ctx.out / "plots", adds
text, tables and images to `doc`, and returns its results (JSON values; a "headline" string among them is also
shown at the top of the report). When it finishes, everything is saved
as OUT/results/<name>.json; a rerun skips finished sections (same mode) unless `fresh`. A section that raises
is saved with its error and shown as failed; the others go on. Derived sections (roofline, claims) only read
other sections' results, so they are always redone.
"""

from __future__ import annotations

import datetime as dt
import gc
import html
import json
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import rich
import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from fuselab.bench import distributed
from fuselab.bench.env import provenance
from fuselab.report.doc import Doc, blocks_to_html, blocks_to_markdown, html_page


@dataclass
class Context:
    """What sections share: the output folder, the device, the mode and its budget, earlier sections' results.

    mode: "quick", "cpu" or "gpu"; budget: the sizes and timings of that mode (see fuselab.report.budgets).
    """

    out: Path
    device: str
    mode: str
    budget: dict
    results: dict[str, dict] = field(default_factory=dict)
    show_progress: bool = True
    logs: Path | None = None  # where sweep logs go when not under `out` (ranks other than 0, under torchrun)

    @property
    def on_gpu(self) -> bool:
        return self.device.startswith("cuda")

    def plot(self, name: str) -> Path:
        """Where to write a plot named `name` (e.g. "matmul_time.png")."""
        path = self.out / "plots" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def log(self, section: str, part: str) -> Path:
        """A resumable JSON-lines file for one sweep of a section: OUT/results/<section>.<part>.jsonl."""
        return (self.logs or self.out) / "results" / f"{section}.{part}.jsonl"

    def need(self, section: str) -> dict:
        """The results of an earlier section; LookupError when it did not finish."""
        if section not in self.results:
            raise LookupError(f"needs the results of section {section!r}, which did not finish")
        return self.results[section]


@dataclass(frozen=True)
class Section:
    name: str
    title: str
    fn: Callable[[Context, Doc], dict]
    derived: bool = False  # reads other sections only: always redone, never resumed


def record_path(out: Path, name: str) -> Path:
    return out / "results" / f"{name}.json"


def load_record(out: Path, name: str) -> dict | None:
    path = record_path(out, name)
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError:
        return None


def forget(out: Path, name: str) -> None:
    """Remove a section's record, sweep logs and plots, so it runs from scratch."""
    record = load_record(out, name)
    for plot in (record or {}).get("plots", []):
        (out / plot).unlink(missing_ok=True)
    for path in (out / "results").glob(f"{name}.*"):
        path.unlink()


def run_section(section: Section, ctx: Context) -> dict:
    """Run one section; return its record (status "ok" or "failed"), also written to OUT/results/<name>.json."""
    doc = Doc(ctx.out)
    start = time.perf_counter()
    record: dict = {
        "name": section.name,
        "title": section.title,
        "mode": ctx.mode,
        "device": ctx.device,
        "env": provenance(ctx.device),
    }  # a section is resumed across runs: what measured it, and when
    try:
        results = section.fn(ctx, doc)
        record.update(status="ok", error=None, results=results or {})
    except Exception as exc:  # a failed section is reported and the report goes on
        record.update(
            status="failed",
            error=f"{type(exc).__name__}: {exc}".strip()[:2000],
            traceback="".join(traceback.format_exception(exc))[-6000:],
            results={},
        )
    _release_memory()
    record.update(
        elapsed_s=time.perf_counter() - start,
        finished=dt.datetime.now().isoformat(timespec="seconds"),
        blocks=doc.blocks,
        plots=doc.plots,
    )
    path = record_path(ctx.out, section.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=1, default=str) + "\n")
    tmp.replace(path)
    return record


def _release_memory() -> None:
    """Let the next section start with the GPU memory this one cached handed back."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _nested_progress_ok() -> bool:
    """rich draws a progress bar inside another from 14.1 on; before that the inner one must stay hidden."""
    from importlib.metadata import version

    major, minor = (int(p) for p in version("rich").split(".")[:2])
    return (major, minor) >= (14, 1)


def run_report(
    sections: Sequence[Section],
    ctx: Context,
    *,
    fresh: bool = False,
    only: Sequence[str] | None = None,
    console: Console | None = None,
) -> dict[str, dict]:
    """Run (or resume) the sections, then write report.md, report.html and results.json. Returns the records.

    only: run just these sections (the others keep what earlier runs left, and are rendered from it).
    """
    names = [s.name for s in sections]
    unknown = [n for n in only or [] if n not in names]
    if unknown:
        raise ValueError(f"unknown section(s) {', '.join(unknown)}; sections: {', '.join(names)}")
    console = console or rich.get_console()
    ctx.out.mkdir(parents=True, exist_ok=True)
    with distributed.LogLock(ctx.out / "report"):  # a second report on the same folder stops before it writes
        return _run_report(sections, ctx, fresh, only, console)


def _run_report(
    sections: Sequence[Section], ctx: Context, fresh: bool, only: Sequence[str] | None, console: Console
) -> dict[str, dict]:
    """run_report's work, under its lock."""
    shown = ctx.show_progress
    ctx.show_progress = shown and _nested_progress_ok()  # the sweeps' own bars, inside the report's
    records: dict[str, dict] = {}
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False, disable=not shown) as progress:
        task = progress.add_task("report", total=len(sections))
        for section in sections:
            selected = only is None or section.name in only
            if selected and fresh:
                forget(ctx.out, section.name)
            previous = load_record(ctx.out, section.name)
            resumable = (
                previous is not None
                and previous.get("status") == "ok"
                and previous.get("mode") == ctx.mode
                and not section.derived
            )
            resumable = distributed.broadcast(resumable)  # under torchrun, every rank runs what rank 0 runs
            if not selected or resumable:
                if previous is not None:
                    records[section.name] = previous
                    if previous.get("status") == "ok":
                        ctx.results[section.name] = previous.get("results", {})
                note = "resumed" if resumable and selected else "kept"
                if previous is not None:
                    progress.console.print(f"[dim]{section.title}: {note} from {record_path(ctx.out, section.name)}")
                progress.advance(task)
                continue
            progress.update(task, description=f"report: {section.title}")
            record = run_section(section, ctx)
            records[section.name] = record
            if record["status"] == "ok":
                ctx.results[section.name] = record["results"]
                progress.console.print(f"[green]✓[/green] {section.title} ({record['elapsed_s']:.1f} s)")
            else:
                progress.console.print(f"[red]✗ {section.title} failed[/red]: {record['error'].splitlines()[0]}")
            progress.advance(task)
        progress.update(task, description="report")
    if distributed.is_main():
        write_outputs(sections, records, ctx)
    return records


# ------------------------------------------------------------------------------------------------ output


def _anchor(name: str) -> str:
    return f"sec-{name}"


def _status(record: dict | None) -> str:
    return "missing" if record is None else str(record.get("status"))


def header(sections: Sequence[Section], records: dict[str, dict], ctx: Context) -> tuple[list[str], list[list[str]]]:
    """The overview table: section, status, time."""
    rows = []
    for s in sections:
        r = records.get(s.name)
        status = {"ok": "done", "failed": "**failed**", "missing": "not run"}[_status(r)]
        rows.append([s.title, status, f"{r['elapsed_s']:.1f} s" if r else "", (r or {}).get("finished", "")])
    return ["section", "status", "time", "finished"], rows


def environment_lines(ctx: Context, env: dict | None = None) -> list[str]:
    """The report's provenance (`provenance`, or `env`): device, versions, clocks, revision, host, threads, time."""
    env = env or provenance(ctx.device)
    what = env["gpu"] or f"CPU ({env.get('cpu_model') or env['cpu'] or 'unknown'})"
    return [
        f"- device: **{what}** (`{ctx.device}`), mode **{ctx.mode}**" + _clocks_text(env.get("clocks")),
        f"- torch {env['torch']}, Triton {env['triton'] or 'not installed'}, CUDA {env['cuda'] or '-'}, "
        f"Python {env['python']}" + (f", driver {env['driver']}" if env.get("driver") else ""),
        f"- written {env['written']} by `fuselab report` {env['fuselab']} at revision {str(env['revision'])[:12]}"
        + (" (with uncommitted changes)" if env["dirty"] else "")
        + f", on {env['host']}, {env['threads']} torch threads",
    ]


def _clocks_text(clocks: dict | None) -> str:
    """', SM 1755 of 1980 MHz, memory 2619 of 3201 MHz' / ', 2445 MHz' ('' where the clocks could not be read)."""
    if not clocks:
        return ""
    if "cpu_mhz" in clocks:
        return f", {clocks['cpu_mhz']:.0f} MHz"
    parts = [
        f"{name} {now} of {top} MHz"
        for name, (now, top) in (("SM", clocks["sm_mhz"]), ("memory", clocks["memory_mhz"]))
    ]
    return ", " + ", ".join(parts)


def resumed_elsewhere(sections: Sequence[Section], records: dict[str, dict], revision: str) -> list[str]:
    """One line per other revision whose sections the report shows (resumed from an earlier run), naming them."""
    by_revision: dict[str, list[str]] = {}
    for s in sections:
        theirs = ((records.get(s.name) or {}).get("env") or {}).get("revision")
        if theirs and theirs != revision:
            by_revision.setdefault(str(theirs), []).append(s.title)
    return [f"- {', '.join(titles)}: resumed from another revision ({rev[:12]})" for rev, titles in by_revision.items()]


def write_outputs(sections: Sequence[Section], records: dict[str, dict], ctx: Context) -> None:
    """report.md, report.html (images embedded) and results.json (every section's record) in ctx.out."""
    title = "fuselab report: GPU kernels, measured"
    env = provenance(ctx.device)
    env_lines = environment_lines(ctx, env) + resumed_elsewhere(sections, records, str(env["revision"]))
    total = sum(r.get("elapsed_s", 0.0) for r in records.values())
    env_lines.append(f"- the sections took {total / 60:.1f} minutes in all (resumed ones as first run)")
    head, rows = header(sections, records, ctx)
    overview = Doc(ctx.out)
    overview.text("\n".join(env_lines))
    headlines = [r["results"]["headline"] for r in records.values() if (r.get("results") or {}).get("headline")]
    if headlines:
        overview.text("\n".join(f"- {h}" for h in headlines))
    overview.table(head, rows, caption="sections")

    md = [f"# {title}", "", blocks_to_markdown(overview.blocks), "", "## Contents", ""]
    md += [f"{i}. [{s.title}](#{_anchor(s.name)})" for i, s in enumerate(sections, 1)]
    html_sections = []
    for s in sections:
        r = records.get(s.name)
        body = section_blocks(r)
        md += ["", f'<a id="{_anchor(s.name)}"></a>', "", f"## {s.title}", "", blocks_to_markdown(body)]
        cls = ' class="failed"' if _status(r) == "failed" else ""
        html_sections.append(
            f'<section id="{_anchor(s.name)}"{cls}><h2>{html.escape(s.title)}</h2>'
            f"{blocks_to_html(body, ctx.out)}</section>"
        )
    (ctx.out / "report.md").write_text("\n".join(md).rstrip() + "\n")
    toc = [(_anchor(s.name), s.title, _status(records.get(s.name))) for s in sections]
    page = html_page(title, toc, blocks_to_html(overview.blocks, ctx.out), "\n".join(html_sections))
    (ctx.out / "report.html").write_text(page)
    summary = {"env": env, "mode": ctx.mode, "device": ctx.device, "sections": records}
    (ctx.out / "results.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")


def section_blocks(record: dict | None) -> list[dict]:
    """The blocks to show for a section: its own, preceded by the error when it failed."""
    if record is None:
        return [{"kind": "text", "text": "*Not run.* Run `fuselab report` without `--only` to include it."}]
    if record.get("status") == "failed":
        failed = [
            {"kind": "text", "text": f"**This section failed** (the rest of the report went on): `{record['error']}`"},
            {"kind": "code", "text": record.get("traceback", ""), "caption": "traceback", "folded": True},
        ]
        return failed + list(record.get("blocks", []))
    return list(record.get("blocks", []))
