"""`launch setup`: apply the bundled playbooks (launcher/playbooks/site.yml) to an inventory
through ansible-runner.

`launch provision` calls `run_setup` on the inventory it wrote. Every host/task result is
printed as it arrives (one line, host first, so parallel hosts stay readable), then a summary
per host and the failures with their task and message. The whole ansible-runner folder (its
stdout, every job event as JSON) is kept under $LAUNCH_HOME/setup/<timestamp>-<suffix>/.
"""

from __future__ import annotations

import datetime
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from launcher.cluster.catalog import BUILTIN, NVSWITCH
from launcher.cluster.inventory import Node, load_inventory
from launcher.core.bundled import playbooks_dir
from launcher.core.errors import LauncherError
from launcher.core.home import cluster_dir, launch_home

PLAYBOOK = "site.yml"
# The tags site.yml gives its roles; --tags accepts these.
ROLE_TAGS = ("cuda_keyring", "nvidia_driver", "nccl", "efa", "python_env", "cluster_ssh",
             "nccl_tests", "node_facts", "node_checks")
# Instance types whose EFA carries GPUDirect RDMA (AWS's EFA documentation lists P4d, P4de and
# P5 for it); node_checks fails the efa check there when the NVIDIA p2p provider is missing.
GPUDIRECT_RDMA_TYPES = frozenset({"p4d.24xlarge", "p4de.24xlarge", "p5.48xlarge"})
CHECK_TASK = "Run the node checks"  # roles/node_checks/tasks/run.yml


class SetupError(LauncherError):
    """`launch setup` could not start (bad tag, no ansible-playbook); nothing was applied."""


def catalog_vars(nodes: list[Node], inventory: Path) -> dict[str, dict[str, Any]]:
    """launch_platform_catalog: what the catalog says of the inventory's instance types.

    Refuses (before anything runs) a GPU instance type without `gpus` in the inventory: the
    driver checks need to know how many GPUs the node must show.
    """
    missing = [f"{n.name} is a {n.instance_type} with {BUILTIN[n.instance_type].gpu_count} GPUs "
               f"but has no `gpus`: set gpus: {BUILTIN[n.instance_type].gpu_count} in its host "
               "variables" for n in nodes
               if n.instance_type in BUILTIN and BUILTIN[n.instance_type].gpu_count > 0
               and n.gpus is None]
    if missing:
        raise SetupError(f"{inventory}: " + "; ".join(missing) + ". Nothing was changed.")
    catalog = {}
    for itype in sorted({n.instance_type for n in nodes if n.instance_type in BUILTIN}):
        facts = BUILTIN[itype]
        catalog[itype] = {
            "gpus": facts.gpu_count,
            # launch provision attaches one EFA interface per network card, up to the limit.
            "efa": min(facts.network_cards, facts.efa_max_interfaces) if facts.efa_supported else 0,
            "nvswitch": facts.interconnect == NVSWITCH,
            "gdr": itype in GPUDIRECT_RDMA_TYPES,
        }
    return catalog


def facts_dir(inventory: Path, cluster: str | None) -> Path:
    """Where node_facts puts <host>.json on this machine."""
    if cluster:
        return cluster_dir(cluster) / "facts"
    return inventory.resolve().parent / "facts"


@dataclass
class HostCounts:
    ok: int = 0
    changed: int = 0
    failed: int = 0
    unreachable: int = 0
    skipped: int = 0


@dataclass
class Failure:
    host: str
    task: str
    message: str
    unreachable: bool = False


@dataclass
class SetupReport:
    """What one ansible-runner run did, built from its events as they arrive."""

    counts: dict[str, HostCounts] = field(default_factory=dict)
    failures: list[Failure] = field(default_factory=list)
    # host -> node_checks results ({"check", "status", "evidence"}), the last run per host.
    checks: dict[str, list[dict[str, str]]] = field(default_factory=dict)


def _task_label(data: dict[str, Any]) -> str:
    role = data.get("role")
    task = (data.get("task") or "").strip()
    return f"{role} : {task}" if role else task


def _result_message(res: dict[str, Any]) -> str:
    """The part of a failed result that says why: msg, then the end of stderr/stdout."""
    if res.get("results") and isinstance(res["results"], list):
        # A loop: the items that failed say more than "One or more items failed".
        failed = [r for r in res["results"] if isinstance(r, dict) and r.get("failed")]
        if failed:
            return "; ".join(f"{r.get('item')}: {_result_message(r)}" for r in failed)
    parts = []
    msg = res.get("msg")
    if msg:
        parts.append(msg if isinstance(msg, str) else json.dumps(msg))
    for stream in ("stderr", "stdout", "module_stderr", "module_stdout"):
        text = (res.get(stream) or "").strip()
        if text and text not in parts:
            parts.append("\n".join(text.splitlines()[-15:]))
            break
    return "\n".join(parts) or "no message"


class ProgressPrinter:
    """ansible-runner event handler: one line per host and task result, as they arrive."""

    def __init__(self, hosts: list[str], out: TextIO, log: TextIO, echo: bool = True):
        self.width = max((len(h) for h in hosts), default=8)
        self.out, self.log = out, log
        self.echo = echo
        self.report = SetupReport()

    def line(self, text: str) -> None:
        for stream in (self.out, self.log) if self.echo else (self.log,):
            stream.write(text + "\n")
            stream.flush()

    def _line_for(self, host: str, status: str, text: str) -> None:
        lines = text.splitlines() or [""]
        indent = " " * (self.width + 14)
        self.line(f"{host:<{self.width}}  {status:<11} {lines[0]}"
                  + "".join(f"\n{indent}{line}" for line in lines[1:]))

    def _host_line(self, host: str, status: str, data: dict[str, Any], note: str = "") -> None:
        label = _task_label(data)
        self._line_for(host, status, f"{label}: {note}" if note else label)

    def __call__(self, event: dict[str, Any]) -> bool:
        kind = event.get("event", "")
        data = event.get("event_data") or {}
        host = data.get("host") or ""
        res = data.get("res") or {}
        if kind == "playbook_on_play_start":
            self.line(f"play: {data.get('play', '').strip()}")
        elif kind == "runner_on_ok":
            changed = bool(res.get("changed"))
            if data.get("task_action") in ("debug", "ansible.builtin.debug") and "msg" in res:
                # The roles explain skipped steps and check-mode previews with debug messages:
                # the message is the news, not the task's name.
                msg = res["msg"] if isinstance(res["msg"], str) else json.dumps(res["msg"])
                role = data.get("role")
                self._line_for(host, "info", f"{role} : {msg}" if role else msg)
            else:
                self._host_line(host, "changed" if changed else "ok", data)
            if data.get("task", "").strip() == CHECK_TASK and res.get("stdout"):
                try:
                    self.report.checks[host] = json.loads(res["stdout"])["checks"]
                except (ValueError, KeyError, TypeError):
                    pass
        elif kind == "runner_on_skipped":
            # Skipped tasks (the other branch of a when) go to the log only: on the terminal
            # they would outnumber the tasks that ran. The summary counts them.
            self.log.write(f"{host:<{self.width}}  {'skipped':<11} {_task_label(data)}\n")
        elif kind == "runner_on_failed":
            message = _result_message(res)
            if data.get("ignore_errors"):
                self._host_line(host, "ignored", data, message)
            else:
                self.report.failures.append(Failure(host, _task_label(data), message))
                self._host_line(host, "FAILED", data, message)
        elif kind == "runner_on_unreachable":
            message = _result_message(res)
            self.report.failures.append(Failure(host, _task_label(data), message, unreachable=True))
            self._host_line(host, "UNREACHABLE", data, message)
        elif kind == "playbook_on_stats":
            for key, attr in (("ok", "ok"), ("changed", "changed"), ("failures", "failed"),
                              ("dark", "unreachable"), ("skipped", "skipped")):
                for name, number in (data.get(key) or {}).items():
                    setattr(self.report.counts.setdefault(name, HostCounts()), attr, number)
        return True


def _new_run_dir() -> Path:
    root = launch_home() / "setup"
    root.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path(tempfile.mkdtemp(prefix=f"{stamp}-", dir=root))


def _ansible_playbook() -> str:
    # A venv's bin is not on PATH when launch runs as .venv/bin/launch: look beside python too.
    beside = Path(sys.executable).parent / "ansible-playbook"
    found = shutil.which("ansible-playbook") or (str(beside) if beside.exists() else None)
    if not found:
        raise SetupError("ansible-playbook not found: install launch with its dependencies "
                         "(pip install -e .), which include ansible-core and ansible-runner")
    return found


def _close_ssh_masters(control_dir: Path) -> None:
    """Ansible leaves ControlPersist masters behind for a minute; launch leaves none."""
    for socket in control_dir.iterdir():
        try:
            subprocess.run(["ssh", "-O", "exit", "-o", f"ControlPath={socket}", "launch-setup"],
                           stdin=subprocess.DEVNULL, capture_output=True, timeout=15, check=False)
        except (OSError, subprocess.TimeoutExpired):
            pass  # the master goes away by itself after ControlPersist (60 s)
    shutil.rmtree(control_dir, ignore_errors=True)


def _print_summary(report: SetupReport, out: TextIO, width: int) -> None:
    out.write("\nsummary:\n")
    out.write(f"  {'host':<{width}}  {'ok':>4} {'changed':>8} {'failed':>7} {'unreachable':>12} "
              f"{'skipped':>8}\n")
    for host, c in report.counts.items():
        out.write(f"  {host:<{width}}  {c.ok:>4} {c.changed:>8} {c.failed:>7} {c.unreachable:>12} "
                  f"{c.skipped:>8}\n")
    for failure in report.failures:
        what = "unreachable" if failure.unreachable else "failed"
        out.write(f"\n{failure.host} {what} at '{failure.task}':\n")
        out.write("".join(f"  {line}\n" for line in failure.message.splitlines()))


def run_setup(inventory: Path, *, check: bool = False, tags: list[str] | None = None,
              limit: str | None = None, cluster: str | None = None,
              out: TextIO | None = None, extra_vars: dict[str, Any] | None = None) -> int:
    """Apply site.yml to the inventory's hosts; the exit code (0 when every host succeeded).

    Raises InventoryError for an unreadable inventory and SetupError for bad arguments, before
    anything runs. Node facts go to facts_dir(inventory, cluster); without `cluster` the
    inventory's launch_cluster (written by `launch provision`) names it. `extra_vars` override
    every other variable (Ansible's -e), e.g. {"launch_platform_reboot_allowed": False}.
    """
    return apply_playbook(inventory, check=check, tags=tags, limit=limit, cluster=cluster,
                          out=out, extra_vars=extra_vars).rc


@dataclass
class SetupRun:
    rc: int
    report: SetupReport
    run_dir: Path


@dataclass(frozen=True)
class SetupPlan:
    """What one `launch setup` hands ansible-playbook: printed by --dry-run, run by
    apply_playbook."""

    inventory: Path
    hosts: list[str]
    playbook: Path
    ansible_playbook: str
    check: bool
    tags: list[str]
    limit: str | None
    facts: Path
    extravars: dict[str, Any]

    def argv(self) -> list[str]:
        """The ansible-playbook command line ansible-runner runs (in the playbooks folder);
        the variables go in a file of its own (shown beside, not pasted here)."""
        return ([self.ansible_playbook, "-i", str(self.inventory)]
                + (["--limit", self.limit] if self.limit else [])
                + (["--tags", ",".join(self.tags)] if self.tags else [])
                + (["--check"] if self.check else [])
                + ["-e", "@EXTRAVARS", self.playbook.name])

    def describe(self) -> list[str]:
        mode = " in check mode (nothing changes)" if self.check else ""
        return [f"launch setup{mode}: {len(self.hosts)} host(s) in {self.inventory}: "
                + ", ".join(self.hosts),
                f"  in {self.playbook.parent}: {shlex.join(self.argv())}",
                f"  EXTRAVARS: {json.dumps(self.extravars, sort_keys=True)}",
                f"  node facts to {self.facts}/<host>.json"]


def plan_setup(inventory: Path, *, check: bool = False, tags: list[str] | None = None,
               limit: str | None = None, cluster: str | None = None,
               extra_vars: dict[str, Any] | None = None) -> SetupPlan:
    """Reads the inventory and checks the arguments; contacts no host, changes nothing."""
    inventory = Path(inventory).resolve()
    nodes = load_inventory(inventory)
    tags = [t for tag in (tags or []) for t in tag.split(",") if t]
    unknown = [t for t in tags if t not in ROLE_TAGS]
    if unknown:
        raise SetupError(f"unknown tag(s) {', '.join(unknown)}: --tags takes "
                         f"{', '.join(ROLE_TAGS)}")
    if cluster is None:
        cluster = next((n.extra.get("launch_cluster") for n in nodes
                        if n.extra.get("launch_cluster")), None)
    catalog = catalog_vars(nodes, inventory)
    facts = facts_dir(inventory, cluster)
    return SetupPlan(
        inventory=inventory, hosts=[n.name for n in nodes],
        playbook=playbooks_dir() / PLAYBOOK, ansible_playbook=_ansible_playbook(),
        check=check, tags=tags, limit=limit, facts=facts,
        extravars={"node_facts_controller_dir": str(facts),
                   "cluster_ssh_controller_dir": str(facts.parent / "ssh"),
                   "launch_platform_catalog": catalog, **(extra_vars or {})})


def apply_playbook(inventory: Path, *, check: bool = False, tags: list[str] | None = None,
                   limit: str | None = None, cluster: str | None = None,
                   out: TextIO | None = None, extra_vars: dict[str, Any] | None = None,
                   echo: bool = True, what: str = "launch setup") -> SetupRun:
    """run_setup's work, with the report kept; echo=False keeps the progress in the log only."""
    import ansible_runner  # imported here: `launch --help` should not pay for it

    out = out or sys.stdout
    plan = plan_setup(inventory, check=check, tags=tags, limit=limit, cluster=cluster,
                      extra_vars=extra_vars)
    inventory, tags, facts = plan.inventory, plan.tags, plan.facts
    run_dir = _new_run_dir()
    # Control sockets need a short path (108 bytes); $LAUNCH_HOME can be deep.
    control_dir = Path(tempfile.mkdtemp(prefix="launch-ssh-"))
    hosts = plan.hosts
    with open(run_dir / "progress.log", "w") as log:
        printer = ProgressPrinter(hosts, out, log, echo=echo)
        mode = " in check mode (nothing changes)" if check else ""
        scope = (f", limited to {limit}" if limit else "") + (
            f", tags {','.join(tags)}" if tags else "")
        first = (f"{what}{mode}: {len(hosts)} host(s) in {inventory}{scope}; log in {run_dir}")
        printer.line(first)
        if not echo:
            out.write(first + "\n")
        try:
            runner = ansible_runner.run(
                private_data_dir=str(run_dir),
                project_dir=str(plan.playbook.parent),
                playbook=plan.playbook.name,
                inventory=str(inventory),
                limit=limit,
                tags=",".join(tags) or None,
                cmdline="--check" if check else None,
                extravars=plan.extravars,
                envvars={
                    # ansible-runner finds ansible-playbook on this PATH (its `binary` option
                    # would switch it to running a raw command without the playbook).
                    "PATH": os.pathsep.join([str(Path(plan.ansible_playbook).parent),
                                             os.environ.get("PATH", "")]),
                    # ansible-runner turns host key checking off unless told otherwise; the
                    # inventory's known_hosts (launch provision verifies them) must count.
                    "ANSIBLE_HOST_KEY_CHECKING": "True",
                    "ANSIBLE_CONFIG": str(plan.playbook.parent / "ansible.cfg"),
                    "ANSIBLE_SSH_CONTROL_PATH_DIR": str(control_dir),
                    "ANSIBLE_NOCOLOR": "1",
                },
                ident="ansible",
                quiet=True,
                event_handler=printer,
            )
        finally:
            _close_ssh_masters(control_dir)
        report = printer.report
        if report.counts:
            if echo:
                _print_summary(report, out, printer.width)
            _print_summary(report, log, printer.width)
    rc = runner.rc or 0
    stdout_log = run_dir / "artifacts" / "ansible" / "stdout"
    if not report.counts and rc == 0:
        # Older Ansible only warns when --limit matches nothing, and exits 0.
        out.write(f"\nno host ran: --limit {limit!r} matches no host of {inventory}\n"
                  if limit else "\nno host ran\n")
        rc = 2
    elif rc != 0 and not report.failures:
        # No host failed, so Ansible itself did (syntax, inventory, options): show its words.
        tail = stdout_log.read_text(errors="replace").splitlines()[-20:] if stdout_log.exists() else []
        out.write(f"\nansible-playbook exited {rc}:\n")
        out.write("".join(f"  {line}\n" for line in tail))
    succeeded = [h for h, c in report.counts.items() if c.failed == 0 and c.unreachable == 0]
    if succeeded and not check and (not tags or "node_facts" in tags):
        out.write(f"\nnode facts: {facts}/<host>.json\n")
    if echo:
        out.write(f"full log: {stdout_log}\n")
    out.flush()
    return SetupRun(rc, report, run_dir)


def syntax_check(inventory: Path, out: TextIO | None = None,
                 extra_vars: dict | None = None) -> int:
    """`launch setup --syntax-check`: ansible-playbook's --syntax-check of the bundled site.yml
    with this inventory: the playbooks parse, their roles are found, the inventory loads. It
    reaches no host, so it answers on any machine whether launch's playbooks are usable there."""
    out = out or sys.stdout
    inventory = Path(inventory).resolve()
    load_inventory(inventory)
    ansible_playbook = _ansible_playbook()
    playbooks = playbooks_dir()
    out.write(f"launch setup --syntax-check: {playbooks / PLAYBOOK} with {inventory}\n"
              f"  (by {ansible_playbook})\n")
    proc = subprocess.run(
        [ansible_playbook, "--syntax-check", "-i", str(inventory),
         *(["-e", json.dumps(extra_vars)] if extra_vars else []), PLAYBOOK], cwd=playbooks,
        env={**os.environ, "ANSIBLE_CONFIG": str(playbooks / "ansible.cfg"),
             "ANSIBLE_NOCOLOR": "1"},
        stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False)
    text = (proc.stdout + proc.stderr).strip()
    out.write("".join(f"  {line}\n" for line in text.splitlines()))
    out.write("syntax check passed\n" if proc.returncode == 0 else
              f"syntax check failed: ansible-playbook exited {proc.returncode}\n")
    out.flush()
    return proc.returncode
