"""Opening a page in a real headless browser (Debian's chromium) and reading what it shows:
the DOM after parsing, the text of every plot, the console's messages, a screenshot."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

# As root chromium needs --no-sandbox; the rest keeps it from reaching the network (no
# component updates, sync, QUIC or background requests) and from reusing a profile.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--enable-logging=stderr", "--v=0"]


def chromium() -> str | None:
    return shutil.which("chromium")


@dataclass
class Page:
    dom: str
    console: list[str]                        # the page's console messages
    figures: dict[str, list[str]] = field(default_factory=dict)   # figure id -> its texts
    svgs: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)             # src= of any element

    def text(self, figure: str) -> str:
        return " | ".join(self.figures[figure])


class _Reader(HTMLParser):
    """Per <figure id=...>, the text of its SVG <text> elements; links; every src."""

    def __init__(self, page: Page):
        super().__init__(convert_charrefs=True)
        self.page = page
        self.figure: str | None = None
        self.in_text = 0

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "figure":
            self.figure = attrs.get("id") or f"figure-{len(self.page.figures)}"
            self.page.figures[self.figure] = []
        elif tag == "text" and self.figure:
            self.in_text += 1
            self.page.figures[self.figure].append("")
        elif tag == "a" and attrs.get("href"):
            self.page.links.append(attrs["href"])
        if attrs.get("src"):
            self.page.sources.append(attrs["src"])

    def handle_endtag(self, tag):
        if tag == "figure":
            self.figure = None
        elif tag == "text" and self.in_text:
            self.in_text -= 1

    def handle_data(self, data):
        if self.in_text and self.figure:
            self.page.figures[self.figure][-1] += data


def _svgs(dom: str) -> list[str]:
    out, pos = [], 0
    while (start := dom.find("<svg", pos)) >= 0:
        end = dom.index("</svg>", start) + len("</svg>")
        out.append(dom[start:end])
        pos = end
    return out


def open_page(path: Path, *, screenshot: Path | None = None, width: int = 1200,
              height: int = 1600) -> Page:
    """The page as chromium parsed it (--dump-dom), and a screenshot when asked."""
    binary = chromium()
    assert binary, "chromium is not installed (scripts/test installs it as root)"
    url = path.resolve().as_uri()
    with tempfile.TemporaryDirectory(prefix="chromium-") as profile:
        base = [binary, *FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}"]
        proc = subprocess.run([*base, "--dump-dom", url], capture_output=True, text=True,
                              timeout=120, stdin=subprocess.DEVNULL)
        assert proc.returncode == 0, proc.stderr[-3000:]
        if screenshot is not None:
            shot = subprocess.run([*base, f"--screenshot={screenshot}", url],
                                  capture_output=True, text=True, timeout=120,
                                  stdin=subprocess.DEVNULL)
            assert shot.returncode == 0 and screenshot.exists(), shot.stderr[-3000:]
    console = [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]
    page = Page(proc.stdout, console)
    _Reader(page).feed(proc.stdout)
    page.svgs = _svgs(proc.stdout)
    return page


def well_formed(svg: str) -> bool:
    """The plot's SVG as the browser serialized it parses as XML."""
    try:
        ET.fromstring(svg)
    except ET.ParseError:
        return False
    return True
