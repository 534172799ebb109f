"""The HTML form of launch's pages (a run's report.html, `launch compare --html`): one file that
opens anywhere, offline: styles inline, plots inline as SVG whose labels stay text (searchable
and selectable, not pixels), no script and nothing fetched from the network."""

from __future__ import annotations

import html
import io
import re
from collections.abc import Callable, Iterable
from pathlib import PurePosixPath
from urllib.parse import quote

CSS = """
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1d2330;
       max-width: 1180px; margin: 0 auto; padding: 1.2em 1.6em 3em; background: #fbfbfd; }
h1 { font-size: 1.5em; margin: 0.2em 0; word-break: break-all; }
h2 { font-size: 1.15em; margin: 1.8em 0 0.5em; padding-bottom: 0.2em;
     border-bottom: 1px solid #dde1ea; }
p, li { max-width: 95ch; }
.lead { color: #4b5568; margin-top: 0; }
.figures { display: flex; flex-wrap: wrap; gap: 0.6em 1.2em; margin: 0.8em 0 0.4em;
           padding: 0; list-style: none; }
.figures li { background: #fff; border: 1px solid #dde1ea; border-radius: 6px;
              padding: 0.35em 0.8em; }
.figures b { display: block; font-size: 1.25em; }
.figures span { color: #5b6478; font-size: 0.85em; }
figure { margin: 0.8em 0; background: #fff; border: 1px solid #dde1ea; border-radius: 6px;
         padding: 0.4em; }
figure svg { width: 100%; height: auto; display: block; }
table { border-collapse: collapse; margin: 0.6em 0; background: #fff; font-size: 0.92em; }
th, td { border: 1px solid #dde1ea; padding: 0.3em 0.6em; text-align: left;
         vertical-align: top; }
th { background: #f0f2f7; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.status-succeeded { color: #1a7f37; font-weight: 600; }
.status-failed, .status-interrupted, .warn { color: #b42318; }
.none { color: #5b6478; font-style: italic; }
.timeline .bar { display: flex; height: 1.4em; border: 1px solid #dde1ea; border-radius: 4px;
                 overflow: hidden; background: #fff; }
.timeline .bar span { display: block; height: 100%; }
.timeline .legend { display: flex; flex-wrap: wrap; gap: 0.2em 1em; list-style: none;
                    padding: 0; margin: 0.3em 0; font-size: 0.85em; color: #4b5568; }
.timeline .legend i { display: inline-block; width: 0.8em; height: 0.8em;
                      margin-right: 0.3em; vertical-align: -0.05em; }
code { background: #eef0f5; padding: 0 0.25em; border-radius: 3px; font-size: 0.9em; }
"""


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def document(title: str, body: Iterable[str]) -> str:
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
            f"<title>{esc(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n"
            + "\n".join(body) + "\n</body>\n</html>\n")


def figures_strip(items: Iterable[tuple[str, str]]) -> str:
    """The headline numbers: (value, what it is) pairs."""
    cells = "".join(f"<li><b>{esc(value)}</b><span>{esc(label)}</span></li>"
                    for value, label in items)
    return f"<ul class=\"figures\">{cells}</ul>" if cells else ""


def table(header: Iterable[str], rows: Iterable[Iterable[str]], *,
          numeric: Iterable[int] = ()) -> str:
    """Cells are escaped here; `numeric` column indexes are right-aligned."""
    right = set(numeric)
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    num = ' class="num"'
    body = "".join(
        "<tr>" + "".join(f"<td{num if i in right else ''}>{esc(c)}</td>"
                         for i, c in enumerate(row)) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def none(sentence: str) -> str:
    """What stands where a plot would, when the run lacks its data."""
    return f"<p class=\"none\">{esc(sentence)}</p>"


_SVG_SIZE = re.compile(r'<svg([^>]*?) width="[^"]*" height="[^"]*"')


def svg(fig, ident: str, caption: str | None = None) -> str:
    """A matplotlib figure as inline SVG in a <figure id=ident>. Text is kept as <text>
    elements (svg.fonttype none), and the fixed size gives way to the page's width."""
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        fig.savefig(buf, format="svg")
    text = buf.getvalue()
    text = _SVG_SIZE.sub(r"<svg\1", text[text.index("<svg"):], count=1)
    label = f"<figcaption>{esc(caption)}</figcaption>" if caption else ""
    return f"<figure id=\"{esc(ident)}\">{text}{label}</figure>"


# ------------------------------------------------------------------ links

def href(path: str) -> str | None:
    """The one way a page makes a link: `path`, relative to the page's folder (a run folder),
    as a relative URL, or None when it is not one. Whatever the path came from (a file name,
    a summary.json field), no URL scheme reaches an href: anything absolute, with `..`, a
    colon, a backslash or a control character is refused, and every part is percent-encoded
    behind "./", so a browser can read the link only as a file beside the page."""
    if not path or len(path) > 1024 or any(c in path for c in ":\\") \
            or any(ord(c) < 32 or ord(c) == 127 for c in path):
        return None
    parts = PurePosixPath(path)
    if parts.is_absolute() or ".." in parts.parts or not parts.parts:
        return None
    return "./" + "/".join(quote(part, safe="") for part in parts.parts)


# ------------------------------------------------------------------ report.md's text as HTML

_CODE = re.compile(r"`([^`]+)`")


def _inline(text: str, link: Callable[[str], str | None]) -> str:
    """Escaped text; `code` spans, linked when `link` names a file for them (a path relative
    to the page, made a URL by href alone)."""
    out, pos = [], 0
    for m in _CODE.finditer(text):
        out.append(esc(text[pos:m.start()]))
        target = link(m.group(1))
        url = href(target) if target else None
        code = f"<code>{esc(m.group(1))}</code>"
        out.append(f"<a href=\"{esc(url)}\">{code}</a>" if url else code)
        pos = m.end()
    out.append(esc(text[pos:]))
    return "".join(out)


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split(" | ")]


def markdown(text: str, link: Callable[[str], str | None] = lambda _: None) -> str:
    """The markdown report.md is written in (headings, pipe tables, bullets, paragraphs,
    `code`, fenced blocks of lines) as HTML."""
    out: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
        elif line.startswith("```"):
            block = []
            i += 1
            while i < len(lines) and not lines[i].startswith("```"):
                block.append(lines[i])
                i += 1
            i += 1
            out.append(f"<pre>{esc(chr(10).join(block))}</pre>")
        elif line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            out.append(f"<h{level}>{_inline(line[level:].strip(), link)}</h{level}>")
            i += 1
        elif line.startswith("|"):
            block = []
            while i < len(lines) and lines[i].startswith("|"):
                block.append(lines[i])
                i += 1
            rows = [_cells(row) for row in block if not re.fullmatch(r"[|\s:-]+", row)]
            head = "".join(f"<th>{_inline(c, link)}</th>" for c in rows[0])
            body = "".join("<tr>" + "".join(f"<td>{_inline(c, link)}</td>" for c in row)
                           + "</tr>" for row in rows[1:])
            out.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
        elif line.startswith("- "):
            items = []
            while i < len(lines) and lines[i].startswith("- "):
                items.append(f"<li>{_inline(lines[i][2:], link)}</li>")
                i += 1
            out.append(f"<ul>{''.join(items)}</ul>")
        else:
            block = []
            while i < len(lines) and lines[i].strip() and not lines[i].startswith(("#", "|",
                                                                                     "- ")):
                block.append(lines[i])
                i += 1
            out.append(f"<p>{_inline(' '.join(block), link)}</p>")
    return "\n".join(out)


def markdown_sections(text: str) -> tuple[str, dict[str, str]]:
    """(what precedes the first `## ` heading, {heading: its body}) of a markdown text."""
    head, sections, current = [], {}, None
    for line in text.splitlines():
        if line.startswith("## "):
            current = line[3:].strip()
            sections[current] = []
        elif current is None:
            head.append(line)
        else:
            sections[current].append(line)
    return "\n".join(head), {k: "\n".join(v) for k, v in sections.items()}
