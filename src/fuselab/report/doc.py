"""A section's content as blocks (text, tables, images, code), rendered to Markdown and to self-contained HTML.

Text takes a little Markdown: paragraphs split by blank lines, `- ` bullet lines, **bold**, `code` and
[links](url). Images are files under the report folder: linked from the Markdown, embedded (base64) in the HTML.
"""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Sequence
from pathlib import Path

Block = dict[str, object]


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


def blocks_to_markdown(blocks: Sequence[Block]) -> str:
    out = []
    for b in blocks:
        kind = b["kind"]
        if kind == "text":
            out.append(str(b["text"]))
        elif kind == "table":
            out.append(_md_table(b))
        elif kind == "image":
            out.append(f"![{b['caption']}]({b['path']})" + (f"\n\n*{b['caption']}*" if b["caption"] else ""))
        elif kind == "code":
            out.append((f"*{b['caption']}*\n\n" if b.get("caption") else "") + f"```\n{b['text']}\n```")
    return "\n\n".join(out)


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _md_table(b: Block) -> str:
    headers, rows = b["headers"], b["rows"]
    lines = ["| " + " | ".join(_md_cell(h) for h in headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows]
    caption = f"*{b['caption']}*\n\n" if b.get("caption") else ""
    return caption + "\n".join(lines)


# ------------------------------------------------------------------------------------------------ HTML

_INLINE = [
    (re.compile(r"`([^`]+)`"), r"<code>\1</code>"),
    (re.compile(r"\*\*([^*]+)\*\*"), r"<strong>\1</strong>"),
    (re.compile(r"(?<![*\w])\*([^*\s][^*]*)\*(?!\w)"), r"<em>\1</em>"),
    (re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)"), r'<a href="\2">\1</a>'),
]


def inline_html(text: str) -> str:
    """Escape, then turn `code`, **bold**, *italic* and [text](url) into HTML."""
    out = html.escape(text, quote=False)
    for pattern, repl in _INLINE:
        out = pattern.sub(repl, out)
    return out


def text_html(text: str) -> str:
    parts = []
    for para in re.split(r"\n\s*\n", text.strip()):
        lines = para.splitlines()
        if lines and all(line.lstrip().startswith("- ") for line in lines):
            items = "".join(f"<li>{inline_html(line.lstrip()[2:])}</li>" for line in lines)
            parts.append(f"<ul>{items}</ul>")
        elif lines and lines[0].startswith("#"):
            level = min(6, len(lines[0]) - len(lines[0].lstrip("#")))
            parts.append(f"<h{level}>{inline_html(lines[0].lstrip('#').strip())}</h{level}>")
            if lines[1:]:
                parts.append(f"<p>{inline_html(' '.join(lines[1:]))}</p>")
        else:
            parts.append(f"<p>{inline_html(' '.join(lines))}</p>")
    return "\n".join(parts)


def _html_table(b: Block) -> str:
    head = "".join(f"<th>{inline_html(h)}</th>" for h in b["headers"])
    body = "".join("<tr>" + "".join(f"<td>{inline_html(c)}</td>" for c in row) + "</tr>" for row in b["rows"])
    table = f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
    caption = inline_html(str(b.get("caption") or ""))
    if b.get("folded"):
        return f"<details><summary>{caption or 'table'}</summary>{table}</details>"
    return (f'<p class="caption">{caption}</p>' if caption else "") + table


def image_data_uri(path: Path) -> str:
    mime = {".png": "image/png", ".svg": "image/svg+xml", ".jpg": "image/jpeg"}.get(path.suffix.lower(), "image/png")
    return f"data:{mime};base64,{base64.b64encode(path.read_bytes()).decode()}"


def blocks_to_html(blocks: Sequence[Block], root: Path) -> str:
    out = []
    for b in blocks:
        kind = b["kind"]
        if kind == "text":
            out.append(text_html(str(b["text"])))
        elif kind == "table":
            out.append(_html_table(b))
        elif kind == "image":
            path = root / str(b["path"])
            caption = inline_html(str(b["caption"]))
            if path.exists():
                img = f'<img src="{image_data_uri(path)}" alt="{html.escape(str(b["caption"]))}">'
            else:
                img = f'<p class="missing">image missing: {html.escape(str(b["path"]))}</p>'
            out.append(f"<figure>{img}<figcaption>{caption}</figcaption></figure>")
        elif kind == "code":
            pre = f"<pre>{html.escape(str(b['text']))}</pre>"
            caption = inline_html(str(b.get("caption") or ""))
            if b.get("folded"):
                out.append(f"<details><summary>{caption or 'details'}</summary>{pre}</details>")
            else:
                out.append((f'<p class="caption">{caption}</p>' if caption else "") + pre)
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
