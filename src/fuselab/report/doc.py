"""A section's content as blocks (text, tables, images, code), written as Markdown and rendered to self-contained HTML.

Text is Markdown (CommonMark with tables). report.md is the blocks written as Markdown; report.html is that Markdown
rendered by markdown-it-py, block by block, so that tables and code can be folded (<details>) and images embedded
(base64). Raw HTML in the text is escaped, not passed through.
"""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Sequence
from pathlib import Path

from markdown_it import MarkdownIt

Block = dict[str, object]

_MD = MarkdownIt("commonmark", {"html": False}).enable("table")


class Doc:
    """Collects one section's blocks; the paths of the images are relative to the report folder."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.blocks: list[Block] = []

    def text(self, markdown: str) -> None:
        self.blocks.append({"kind": "text", "text": markdown.strip()})

    def table(
        self, headers: Sequence[str], rows: Sequence[Sequence[object]], *, caption: str = "", folded: bool = False
    ) -> None:
        """A table of already formatted cells (None shows empty); folded: collapsed in the HTML."""
        cells = [["" if c is None else str(c) for c in row] for row in rows]
        self.blocks.append(
            {"kind": "table", "headers": list(headers), "rows": cells, "caption": caption, "folded": folded}
        )

    def image(self, path: str | Path, caption: str = "") -> None:
        path = Path(path)
        rel = path.resolve().relative_to(Path(self.root).resolve())
        self.blocks.append({"kind": "image", "path": rel.as_posix(), "caption": caption})

    def code(self, text: str, *, caption: str = "", folded: bool = False) -> None:
        self.blocks.append({"kind": "code", "text": text.rstrip(), "caption": caption, "folded": folded})

    @property
    def plots(self) -> list[str]:
        return [str(b["path"]) for b in self.blocks if b["kind"] == "image"]


# ------------------------------------------------------------------------------------------------ Markdown


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def md_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown (GFM) table; pipes in cells escaped, newlines made spaces."""
    lines = ["| " + " | ".join(_md_cell(h) for h in headers) + " |", "|" + "---|" * len(headers)]
    return "\n".join(lines + ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows])


def md_code(text: str) -> str:
    """A fenced code block, its fence longer than any run of backticks in `text`."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}\n{text}\n{fence}"


def _caption(b: Block) -> str:
    return f"*{b['caption']}*" if b.get("caption") else ""


def blocks_to_markdown(blocks: Sequence[Block]) -> str:
    out = []
    for b in blocks:
        kind = b["kind"]
        if kind == "text":
            body = str(b["text"])
        elif kind == "table":
            body = md_table(b["headers"], b["rows"])
        elif kind == "image":
            body = f"![{b['caption']}]({b['path']})"
        elif kind == "code":
            body = md_code(str(b["text"]))
        else:
            continue
        caption = _caption(b)
        if kind == "image":  # the caption under the picture
            out.append(body + (f"\n\n{caption}" if caption else ""))
        else:
            out.append((f"{caption}\n\n" if caption else "") + body)
    return "\n\n".join(out)


# ------------------------------------------------------------------------------------------------ HTML


def inline_html(text: str) -> str:
    """One line of Markdown (`code`, **bold**, *italic*, [text](url)) as HTML, everything else escaped."""
    return _MD.renderInline(text)


def text_html(text: str) -> str:
    """Markdown text (paragraphs, lists, headings, tables, code) as HTML."""
    return _MD.render(text).strip()


def image_data_uri(path: Path) -> str:
    mime = {".png": "image/png", ".svg": "image/svg+xml", ".jpg": "image/jpeg"}.get(path.suffix.lower(), "image/png")
    return f"data:{mime};base64,{base64.b64encode(path.read_bytes()).decode()}"


def _folded_or_captioned(b: Block, body: str, fallback: str) -> str:
    caption = inline_html(str(b.get("caption") or ""))
    if b.get("folded"):
        return f"<details><summary>{caption or fallback}</summary>{body}</details>"
    return (f'<p class="caption">{caption}</p>' if caption else "") + body


def blocks_to_html(blocks: Sequence[Block], root: Path) -> str:
    out = []
    for b in blocks:
        kind = b["kind"]
        if kind == "text":
            out.append(text_html(str(b["text"])))
        elif kind == "table":
            out.append(_folded_or_captioned(b, text_html(md_table(b["headers"], b["rows"])), "table"))
        elif kind == "code":
            out.append(_folded_or_captioned(b, text_html(md_code(str(b["text"]))), "details"))
        elif kind == "image":
            path = root / str(b["path"])
            if path.exists():
                img = f'<img src="{image_data_uri(path)}" alt="{html.escape(str(b["caption"]))}">'
            else:
                img = f'<p class="missing">image missing: {html.escape(str(b["path"]))}</p>'
            out.append(f"<figure>{img}<figcaption>{inline_html(str(b['caption']))}</figcaption></figure>")
    return "\n".join(out)


CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; max-width: 1100px; margin: 2em auto;
       padding: 0 1em; color: #222; line-height: 1.45; }
h1 { border-bottom: 2px solid #333; padding-bottom: .2em; }
h2 { border-bottom: 1px solid #ccc; padding-bottom: .15em; margin-top: 2.2em; }
table { border-collapse: collapse; margin: .6em 0 1.2em; font-size: .88em; }
th, td { border: 1px solid #ddd; padding: .25em .6em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
tr:nth-child(even) td { background: #fafafa; }
code, pre { font-family: Menlo, Consolas, monospace; font-size: .88em; }
pre { background: #f6f6f6; padding: .7em; overflow-x: auto; }
figure { margin: 1em 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption, .caption { color: #555; font-size: .9em; font-style: italic; }
nav.toc { background: #f7f7f7; padding: .5em 1.2em; border: 1px solid #e3e3e3; }
.failed { border-left: 4px solid #d62728; padding-left: .8em; }
.status-ok { color: #2a7d2a; } .status-failed { color: #d62728; } .status-missing { color: #999; }
details summary { cursor: pointer; color: #335; margin: .4em 0; }
"""


def html_page(title: str, toc: Sequence[tuple[str, str, str]], header_html: str, sections_html: str) -> str:
    """The whole page. toc: (anchor, title, status) per section."""
    items = "".join(
        f'<li><a href="#{a}">{html.escape(t)}</a> <span class="status-{s}">({s})</span></li>' for a, t, s in toc
    )
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{CSS}</style></head><body>\n<h1>{html.escape(title)}</h1>\n{header_html}\n"
        f'<nav class="toc"><strong>Contents</strong><ol>{items}</ol></nav>\n{sections_html}\n</body></html>\n'
    )
