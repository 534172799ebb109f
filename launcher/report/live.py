"""What the terminal's live view says of each node, read from the lines the nodes print.

The bundled trainer's rank 0 prints, at each log interval, a progress line (the bar's step,
loss and images/s) and, on runs of several nodes, one `per node at step N:` line with each
node's step time, communication share, loss and straggler flag (train/stragglers.py). Straggler
lines name the slow rank. A user's own job may print LAUNCH_STEP lines (launcher/runs/progress.py):
each node shows the step its ranks reached, the rate and the last loss. A node that prints
none of these (a job without them, or a node still starting) is shown by what launch sees of
it: how many lines it printed and how long ago the last one came.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass

from launcher.runs.logs import parse_progress
from launcher.runs.progress import parse_step

PER_NODE = re.compile(r"^per node at step (?P<step>\d+): (?P<nodes>.+)$")
_ENTRY = re.compile(r"^(?P<node>\S+) (?P<ms>[0-9.]+) ms/step, comm (?P<comm>\d+)%, "
                    r"loss (?P<loss>[-+0-9.eEinfna]+)(?P<slow>, straggler)?$")
_STRAGGLER = re.compile(r"^straggler: node (?P<node>\S+) rank (?P<rank>\d+) .*?"
                        r"\((?P<ratio>[0-9.]+)x\)")
# The progress line's own figures, for the node that prints it when no per-node line comes
# (a run on one node).
_STEP_TIME = re.compile(r"\bstep_time (?P<s>[0-9.]+)s\b")
_COMM = re.compile(r"waiting on communication (?P<pct>\d+)%")
MAX_ROWS = 16  # more nodes than this: the stragglers first, then a count of the rest
RATE_WINDOW_S = 1.0   # a job's step rate: steps over at least this long


@dataclass
class NodeState:
    name: str
    lines: int = 0
    last_line_at: float | None = None
    step: int | None = None
    step_s: float | None = None
    comm_share: float | None = None
    loss: float | None = None
    straggler: str | None = None     # "rank 3 (1.6x)", "yes" when only the flag is known
    from_per_node: bool = False      # figures from a per-node line (else the progress line's)
    rate_mark: tuple[float, int] | None = None   # (when, step): a job's step rate since then

    def row(self, now: float, width: int) -> str:
        if self.step is None:
            ago = "" if self.last_line_at is None else f", last {now - self.last_line_at:.1f} s ago"
            return f"{self.name:<{width}}  {self.lines} line(s){ago}"
        parts = [f"{self.name:<{width}}", f"step {self.step}"]
        if self.step_s is not None:
            parts.append(f"{1 / self.step_s:.1f} steps/s" if self.step_s > 0 else "- steps/s")
        if self.loss is not None:
            parts.append(f"loss {self.loss:.4f}")
        if self.comm_share is not None:
            parts.append(f"comm {self.comm_share:.0%}")
        if self.straggler:
            parts.append(f"STRAGGLER {self.straggler}")
        return "  ".join(parts)


class NodeBoard:
    """Thread-safe: the line router feeds it, the terminal's refresh thread reads it."""

    def __init__(self, clock=time.monotonic):
        self._clock = clock
        self._nodes: dict[str, NodeState] = {}
        self._lock = threading.Lock()

    def _node(self, name: str) -> NodeState:
        return self._nodes.setdefault(name, NodeState(name))

    def line(self, node: str, text: str) -> bool:
        """Takes one line of `node`; True when it is a per-node line, which the board shows
        in place of printing it."""
        text = text.strip()
        with self._lock:
            state = self._node(node)
            state.lines += 1
            state.last_line_at = self._clock()
            match = PER_NODE.match(text)
            if match:
                self._per_node(int(match["step"]), match["nodes"])
                return True
            slow = _STRAGGLER.match(text)
            if slow:
                self._node(slow["node"]).straggler = f"rank {slow['rank']} ({slow['ratio']}x)"
                return False
            job_step = parse_step(text)
            if job_step is not None:
                self._job_step(state, job_step.step, job_step.loss)
                return False
            progress = parse_progress(text)
            if progress and not state.from_per_node:
                step_time, comm = _STEP_TIME.search(text), _COMM.search(text)
                state.step, state.loss = progress.step, progress.loss
                state.step_s = float(step_time["s"]) if step_time else None
                state.comm_share = int(comm["pct"]) / 100 if comm else None
        return False

    def _job_step(self, state: NodeState, step: int, loss: float | None) -> None:
        now = self._clock()
        if state.rate_mark is None or step < state.rate_mark[1]:     # the first, or a resume
            state.rate_mark = (now, step)
        elif now - state.rate_mark[0] >= RATE_WINDOW_S and step > state.rate_mark[1]:
            state.step_s = (now - state.rate_mark[0]) / (step - state.rate_mark[1])
            state.rate_mark = (now, step)
        state.step = step
        if loss is not None:
            state.loss = loss

    def _per_node(self, step: int, text: str) -> None:
        for part in text.split("; "):
            entry = _ENTRY.match(part.strip())
            if not entry:
                continue
            state = self._node(entry["node"])
            state.from_per_node = True
            state.step, state.step_s = step, float(entry["ms"]) / 1e3
            state.comm_share = int(entry["comm"]) / 100
            state.loss = float(entry["loss"])
            if not entry["slow"]:
                state.straggler = None
            elif not state.straggler:
                state.straggler = "yes"

    def rows(self) -> list[str]:
        with self._lock:
            nodes = list(self._nodes.values())
        if not nodes:
            return []
        now = self._clock()
        width = max(len(n.name) for n in nodes)
        shown = nodes
        if len(nodes) > MAX_ROWS:
            slow = [n for n in nodes if n.straggler]
            shown = (slow + [n for n in nodes if not n.straggler])[:MAX_ROWS - 1]
        rows = [n.row(now, width) for n in shown]
        if len(shown) < len(nodes):
            rows.append(f"... and {len(nodes) - len(shown)} more node(s)")
        return rows
