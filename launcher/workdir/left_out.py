"""What the ignore rules left out of a shipped workdir, said where it matters: when a run
starts, and when its job fails for want of one of those files.

nanoGPT ignores `*.bin`: its data files never reached the nodes, the run said "26 of 26
file(s) shipped" and died on `FileNotFoundError: ... train.bin`. `--dry-run` listed them; a real
run said nothing.
"""

from __future__ import annotations

import os
import posixpath
import re

from launcher.workdir.scan import Manifest, human_bytes

SHOWN = 3   # largest files named in the note


def left_out_note(manifest: Manifest | None) -> str | None:
    """One line on what ignore rules left out (how much, the largest files and the rule that
    left each out) and how to ship it; None when they left out nothing."""
    if manifest is None:
        return None
    ruled = [x for x in manifest.excluded if x.rule]
    if not ruled:
        return None
    files = sorted((x for x in ruled if not x.path.endswith("/")),
                   key=lambda x: (-(x.size or 0), x.path))
    folders = [x for x in ruled if x.path.endswith("/")]
    counts = []
    if files:
        counts.append(f"{len(files)} file(s) of {human_bytes(sum(x.size or 0 for x in files))}")
    if folders:
        counts.append(f"{len(folders)} folder(s)")
    named = [f"{x.path} ({human_bytes(x.size or 0)}, {x.reason})" for x in files[:SHOWN]]
    named += [f"{x.path} ({x.reason})" for x in folders[:max(0, SHOWN - len(named))]]
    more = len(files) + len(folders) - len(named)
    return (f"workdir {manifest.root}: the ignore rules left out {' and '.join(counts)}, not "
            f"shipped: {', '.join(named)}{f', and {more} more' if more else ''}. To ship one, "
            "add `!NAME` to .launchignore (`!DIR/` for a folder); `launch run --dry-run` lists "
            "all")


# How Python (and numpy, torch, ...) names a file that is not there.
_MISSING = re.compile(r"No such file or directory: (?:'(?P<q1>[^']+)'|\"(?P<q2>[^\"]+)\")")


def missing_left_out(manifest: Manifest | None, lines: list[str],
                     workdirs: list[str]) -> list[str]:
    """For each file the job failed to find (its lines say `No such file or directory: 'x'`)
    that the scan left out: a line saying so, the rule, and how to ship it. `workdirs`: where
    the nodes' copies are (a path may be given absolute, inside one)."""
    if manifest is None or not manifest.excluded:
        return []
    out: list[str] = []
    for line in lines:
        for m in _MISSING.finditer(line):
            path = m["q1"] or m["q2"]
            rel = _relative(path, workdirs)
            found = _left_out(manifest, rel) if rel is not None else None
            if found is None:
                continue
            if found.path.endswith("/"):
                how = f"`!{found.path}` in .launchignore ships the folder"
            else:
                how = f"`!{found.path}` in .launchignore ships it"
            text = (f"{path} was not shipped: the workdir scan left out {found.path} "
                    f"({found.reason}); {how}")
            if text not in out:
                out.append(text)
    return out


def _relative(path: str, workdirs: list[str]) -> str | None:
    if path.startswith("/"):
        for top in workdirs:
            if top and (path == top or path.startswith(top.rstrip("/") + "/")):
                return posixpath.normpath(os.path.relpath(path, top))
        return None
    rel = posixpath.normpath(path)
    return None if rel.startswith("..") else rel


def _left_out(manifest: Manifest, rel: str):
    for x in manifest.excluded:
        if not x.rule:
            continue
        if x.path == rel or (x.path.endswith("/") and (rel + "/").startswith(x.path)):
            return x
    return None
