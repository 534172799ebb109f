"""What reaches the terminal of a run with many nodes: the head's lines, every error line and
launch's own messages; every other line goes to its node's log only (LineRouter writes every
line there whatever the screen shows). `launch run --all-lines` shows them all again.

At 64 nodes of 8 ranks the terminal once got 512 ranks' lines through one process: faster than
anyone reads them, burying the one error that mattered, and past the terminal's backlog
(DISPLAY_BACKLOG) lines were skipped in bulk, errors among them."""

from __future__ import annotations

import os
import re
from pathlib import Path

# Up to this many nodes the terminal shows every line. 8 nodes of 8 ranks (one p4d/p5 node each)
# is 64 ranks: still followed by their node/rank prefixes, and every run before issue 37 had 2
# to 8 nodes, whose terminal stays as it was. Beyond it (16 to 256 nodes) a screen of every
# rank's lines is no longer read, only scrolled.
SCREEN_ALL_NODES = 8
# Another limit for this machine (tests, a lab that wants the many-node screen at 3 nodes).
SCREEN_ALL_NODES_ENV = "LAUNCH_SCREEN_ALL_NODES"

# An error line, as the tools a run goes through write one. A rank's uncaught exception after
# init_process_group comes prefixed "[rank1]: " (torch.distributed).
_RANK_TAG = re.compile(r"^\[rank\d+\]: ?")
_ERROR_LINE = re.compile(
    r"^(?:"
    r"[EF]\d{4} \d\d:\d\d:\d\d"          # glog's ERROR/FATAL: torchrun's agent, c10d, torch's C++
    r"|\[[EF]\d* "                        # torch's C++ log, older form: "[E ProcessGroupNCCL.cpp"
    r"|(?:ERROR|CRITICAL|FATAL)\b"        # Python logging's default format
    r"|(?i:error|fatal)\s*:"              # "error: ...", "Fatal: ..." (compilers, CLIs, users)
    r"|[\w.]*(?:Error|Exception|Interrupt)\b"   # an exception's line ("RuntimeError: ...")
    r"|Traceback \(most recent call last\)"
    r"|Segmentation fault|Bus error|Killed\b|Aborted\b"
    r")"
    r"|NCCL WARN|NCCL error"              # NCCL's own errors: "host:pid:tid [0] NCCL WARN ..."
)
# How many nodes the end's message names one by one; the rest are counted together.
_NAMED = 8


def is_error_line(text: str) -> bool:
    return bool(_ERROR_LINE.search(_RANK_TAG.sub("", text.lstrip(), count=1)))


def screen_all_nodes(environ=os.environ) -> int:
    """Up to how many nodes the terminal shows every line (LAUNCH_SCREEN_ALL_NODES, else 8)."""
    value = environ.get(SCREEN_ALL_NODES_ENV, "")
    try:
        return max(0, int(value)) if value.strip() else SCREEN_ALL_NODES
    except ValueError:
        return SCREEN_ALL_NODES


def screen_filter_on(nodes: int, all_lines: bool, environ=os.environ) -> bool:
    return not all_lines and nodes > screen_all_nodes(environ)


class ScreenFilter:
    """Which lines of a many-node run the terminal shows, and how many it kept off, per node.
    `head`: the first node (its agent, rank 0 and the rendezvous store): all its lines."""

    def __init__(self, head: str):
        self.head = head
        self.kept_off: dict[str, int] = {}

    def shows(self, node: str, text: str, in_traceback: bool = False,
              live_view: bool = False) -> bool:
        """Whether the line goes to the terminal (else it is counted). `in_traceback`: the
        line is part of a traceback its rank is printing (its frames and the lines after the
        exception); `live_view`: the line feeds the progress bar (the trainer's rank 0)."""
        if node == self.head or in_traceback or live_view or is_error_line(text):
            return True
        self.kept_off[node] = self.kept_off.get(node, 0) + 1
        return False

    def opening(self, nodes: int) -> str:
        return (f"{nodes} nodes: the terminal shows {self.head}'s lines, every error line and "
                "launch's own; every node's lines are in its log (--all-lines shows them all "
                "here)")

    def closing(self, paths: dict[str, str]) -> str | None:
        """Said once at the end: which nodes' lines are only in their logs, and how many."""
        kept = {n: self.kept_off[n] for n in paths if self.kept_off.get(n)}   # nodes' order
        if not kept:
            return None
        named = list(kept.items())[:_NAMED]
        text = ("lines kept off the terminal are in their logs only: "
                + ", ".join(f"{n} {c} line(s)" for n, c in named))
        rest = list(kept.items())[_NAMED:]
        if rest:
            text += (f", and {sum(c for _, c in rest)} line(s) of {len(rest)} more node(s)")
        logs = [Path(paths[n]) for n in kept]
        if len(logs) == 1:
            return f"{text} ({logs[0]})"
        # <run folder>/<node>/node.log for every node: named once.
        folder = Path(os.path.commonpath([str(p.parent.parent) for p in logs]))
        return f"{text} (each in {folder}/NODE/{logs[0].name})"
