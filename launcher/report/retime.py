"""A run report's timeline drawn again, alone: `rewrite_timeline(run_dir)`.

A handed-over run (launcher/pipeline/handover.py) is reported by its controller at the run's
end; the launch process that followed it then amends summary.json's timeline with what only
it saw (the hand-over, the queue, following the job). Writing the whole report again for that
(launcher/report/build.py write_run_report) costs seconds: matplotlib's import and every plot
drawn again, every node's logs read again. Only the timeline changed, so only what is drawn
from it is written again, with the renderers the whole report uses:

    report.json   its `timeline` key
    report.md     its Time section (build.time_markdown)
    report.html   the parts between the page's timeline markers (html.timeline_parts: the
                  bar, the Time section, a user's job's step curves)

Everything else stays as written, byte for byte. The whole report is written instead when the
one on disk cannot be drawn into: a file missing or unreadable, an older launch's page without
the markers, a report.md without a Time section, or a report no longer current against
summary.json apart from the timeline (what settles a run after its controller wrote the report
can change its status and failure: a time limit, a cancel from outside).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from launcher.core import safefile
from launcher.core.errors import LauncherError
from launcher.report import page
from launcher.report.build import (REPORT_JSON, REPORT_MD, SUMMARY_FACTS, ReportError,
                                   plan_and_summary, run_folder, summary_facts, time_markdown,
                                   write_run_report)
from launcher.report.html import REPORT_HTML, TIME, page_summary, timed, timeline_parts

# The report's own files: a page with inline plots of a many-node run is large, never this.
MAX_REPORT_BYTES = 64 << 20
_TIME_SECTION = re.compile(rf"^## {TIME}\n.*?(?=^## |\Z)", re.M | re.S)


def rewrite_timeline(run_dir: str | Path) -> dict[str, Any]:
    """The report in `run_dir` with summary.json's timeline in place of the one it was written
    with (the whole report written again where that cannot be done); returns the report."""
    run_dir = run_folder(run_dir)
    try:
        drawn = _retimed(run_dir)
    except (KeyError, TypeError, AttributeError, IndexError):
        drawn = None   # a foreign plan or summary: the whole write names it (checked_report)
    if drawn is None:
        return write_run_report(run_dir)
    report, files = drawn
    try:
        for name, text in files.items():
            safefile.write_text(run_dir / name, text, within=run_dir.parent)
    except LauncherError as err:
        raise ReportError(f"{run_dir}: cannot write the report there: {err}") from None
    return report


def _retimed(run_dir: Path) -> tuple[dict[str, Any], dict[str, str]] | None:
    """(the report, {file name: its new text}), or None where the whole report is to be
    written."""
    within = run_dir.parent
    try:
        report = json.loads(safefile.read_text(run_dir / REPORT_JSON, "report",
                                               max_bytes=MAX_REPORT_BYTES, within=within))
        markdown = safefile.read_text(run_dir / REPORT_MD, "report",
                                      max_bytes=MAX_REPORT_BYTES, within=within)
        html = safefile.read_text(run_dir / REPORT_HTML, "report", max_bytes=MAX_REPORT_BYTES,
                                  within=within)
        plan, summary = plan_and_summary(run_dir, [])
    except (LauncherError, ValueError):
        return None
    timeline = (summary or {}).get("timeline")
    if not isinstance(report, dict) or not timeline or not _current(report, plan, summary):
        return None
    report = {**report, "timeline": timeline}
    markdown, found = _TIME_SECTION.subn(lambda _: time_markdown(timeline), markdown, count=1)
    if not found:
        return None
    # The page reads summary.json as it is now: its timeline is the one just put in the report.
    parts = timeline_parts(run_dir, report, page_summary(run_dir),
                           page.markdown_sections(markdown)[1].get(TIME, ""))
    for name, part in parts.items():
        begin, end = timed(name, "\0").split("\0")
        if html.count(begin) != 1 or html.count(end) != 1 or html.index(begin) > html.index(end):
            return None    # a page an older launch wrote: no markers to draw between
        head, rest = html.split(begin)
        html = head + timed(name, part) + rest.split(end)[1]
    return report, {REPORT_JSON: json.dumps(report, indent=2) + "\n", REPORT_MD: markdown,
                    REPORT_HTML: html}


def _current(report: dict[str, Any], plan: dict[str, Any], summary: dict | None) -> bool:
    """Whether what the report states from summary.json, besides its timeline, is what the
    summary says now (as JSON: report.json's types)."""
    now = json.loads(json.dumps(summary_facts(plan, summary)))
    return {key: report[key] for key in SUMMARY_FACTS if key in report} == now
