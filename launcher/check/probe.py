"""Run launcher/check/ask_node.py on every node through the backend (one round trip each, all
at once) and judge the answers into the host x check table's rows."""

from __future__ import annotations

import ast
import json
import time
from dataclasses import dataclass, field
from importlib import resources

from launcher.check import health
from launcher.check.health import Check, expectation
from launcher.cluster.inventory import Node
from launcher.execute.backend import Backend, NodeResult, in_parallel

# The script's text, sent as `python -c`: the node needs nothing of launch installed.
PROBE_SOURCE = resources.files("launcher.check") / "ask_node.py"
MARK = "LAUNCH-CHECK "
# Every tool in the probe has 20 s; torch's import a few more. A node that takes longer is
# reported unreachable rather than holding the table back.
PROBE_TIMEOUT_S = 90.0


@dataclass
class NodeHealth:
    node: Node
    checks: dict[str, Check] = field(default_factory=dict)

    @property
    def failed(self) -> list[str]:
        return [name for name, c in self.checks.items() if c.status == health.FAIL]


def node_function(name: str) -> str:
    """One function of ask_node.py as source, for another node program that must ask what it
    asks the same way (preflight asks torch's facts)."""
    text = PROBE_SOURCE.read_text()
    found = next(n for n in ast.parse(text).body
                 if isinstance(n, ast.FunctionDef) and n.name == name)
    return ast.get_source_segment(text, found) + "\n"


def probe_argv(node: Node) -> list[str]:
    return [node.python, "-c", PROBE_SOURCE.read_text(), node.run_root]


def read_answer(answer: NodeResult) -> tuple[dict | None, str | None]:
    """The probe's JSON, or why there is none (unreachable, interpreter missing, crashed)."""
    if answer.error is not None:
        return None, answer.error
    for line in answer.stdout.splitlines():
        if line.startswith(MARK):
            try:
                return json.loads(line[len(MARK):]), None
            except ValueError as err:
                return None, f"the probe's answer was cut ({err})"
    if answer.exit_code == 127:
        return None, "the node's interpreter (launch_python) is not installed"
    tail = (answer.stderr or answer.stdout).strip().splitlines()[-1:] or ["no output"]
    return None, f"the probe failed (exit {answer.exit_code}): {tail[0]}"


def probe_nodes(backend: Backend, nodes: list[Node],
                timeout: float = PROBE_TIMEOUT_S) -> dict[str, tuple[dict | None, str | None, float]]:
    """node -> (answer, why none, this machine's clock when the answer arrived). One fan-out per
    node, all at once, so that each answer's arrival time is its own (the clock check)."""

    def one(node: Node):
        result = backend.run_on_all([node], probe_argv(node), timeout=timeout)
        arrived = time.time()
        answer, why = read_answer(result[node.name])
        return answer, why, arrived

    by_name = {n.name: n for n in nodes}
    out = {}
    for name, value in in_parallel(lambda name: one(by_name[name]), list(by_name)).items():
        out[name] = (None, f"{type(value).__name__}: {value}", time.time()) \
            if isinstance(value, Exception) else value
    return out


def check_nodes(backend: Backend, nodes: list[Node], *, min_free_bytes: int,
                timeout: float = PROBE_TIMEOUT_S) -> list[NodeHealth]:
    answers = probe_nodes(backend, nodes, timeout)
    rows = []
    probes: dict[str, dict] = {}
    offsets: dict[str, float] = {}
    for node in nodes:
        answer, why, arrived = answers[node.name]
        if answer is None:
            rows.append(NodeHealth(node, health.unreachable(why or "no answer")))
            continue
        probes[node.name] = answer
        offsets[node.name] = answer.get("time", arrived) - arrived
        rows.append(NodeHealth(node, health.node_checks(answer,
                                                        expectation(node, min_free_bytes))))
    versions = health.check_versions(probes)
    clocks = health.check_clocks(offsets)
    for row in rows:
        if row.node.name in probes:
            row.checks["versions"] = versions[row.node.name]
            row.checks["clock"] = clocks[row.node.name]
        row.checks = {name: row.checks[name] for name in health.COLUMNS if name in row.checks}
    return rows
