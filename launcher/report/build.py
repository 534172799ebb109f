"""The run report: `runs/<run_id>/report.md` and `report.json`, written after every `launch run`
(failed ones too) and `launch bench`, and again by `launch report RUN_DIR`.

It reads only files: the run folder (plan.json, summary.json, metrics.jsonl, each node's
result.json, nccl-debug.*.log and topology.txt, a bench's bandwidth.json), the node facts that
`launch setup` fetched ($LAUNCH_HOME/clusters/*/facts/<node>.json) and the catalog. Every file
is read through the run folder's schemas (launcher/runs/schema.py: no link followed inside the
run folder, sizes capped, a wrong key named) and the report is written through a fresh
temporary file (launcher/core/safefile.py): a run folder can be planted or edited. Per node it
states the interconnect, the NCCL version, network and transports NCCL used, EFA expected
against used; then the measured bus bandwidth against the link's peak, the training speed and
the share of step time spent waiting on communication, warnings, and what to change.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import statistics
import sys
from pathlib import Path
from typing import Any, TextIO

from pydantic import BaseModel

from launcher.core import safefile
from launcher.core.errors import LauncherError
from launcher.core.yamlfile import shorten
from launcher.nccl import advice
from launcher.nccl.compare import compare, points_of_json
from launcher.nccl.debug_log import NcclDebugLog, parse_debug_logs
from launcher.nccl.detect import MAX_LOG_BYTES
from launcher.nccl.errors import NcclParseError
from launcher.nccl.links import LinkPeak, efa_interfaces, interconnect_class
from launcher.nccl.summary import human_bytes
from launcher.nccl.sweep import RESULTS_FILE
from launcher.nccl.topology import Topology, parse_topology
from launcher.report.html import REPORT_HTML, write_report_html
from train.stepsplit import split_of_totals
from launcher.runs.schema import (MAX_SMALL, BackendRecord, BandwidthRecord, MetricsLine,
                                NodeFacts, PlanRecord, ResultRecord, SummaryRecord, read_lines,
                                read_record)
from launcher.core.table import printable
from launcher.runs.screen import SCREEN_ALL_NODES
from launcher.runs.timeline import describe as describe_timeline

REPORT_JSON = "report.json"
REPORT_MD = "report.md"
BANDWIDTH_JSON = "bandwidth.json"
# Below this share of the link's peak, a measured bus bandwidth is worth a warning: NVSwitch
# reaches ~77% of NVLink's rate and EFA ~80-100% of the wire (field notes), so half is trouble.
# busbw is what a ring moves per link, the most any algorithm moves, so a low busbw is trouble
# whatever NCCL chose (launcher.nccl.compare).
LOW_PEAK_RATIO = 0.5
RED, RESET = "\033[31m", "\033[0m"


class ReportError(LauncherError):
    """A folder that is not a run folder, or a file in it that cannot be read."""


def _record(model: type[BaseModel], path: Path, within: Path | None,
            warnings: list[str] | None, max_bytes: int | None = None) -> dict | None:
    """A JSON file as its schema, as a plain dict: the keys the file has, each nested record
    whole (its optional keys at their defaults: a restart record without `steps_lost`, a
    partial auto decision, read as launch writes them). `warnings` None: the file is needed (a
    problem is a ReportError); else a file the report can do without: None when absent, and
    when unreadable None and a warning naming it (a killed run can leave half a file)."""
    exists = (safefile.lstat(path, within=within) is not None if within is not None
              else path.exists())
    if not exists and warnings is not None:
        return None
    try:
        kwargs = {} if max_bytes is None else {"max_bytes": max_bytes}
        record = read_record(model, path, within=within, **kwargs)
        return {k: v for k, v in record.model_dump().items() if k in record.model_fields_set}
    except LauncherError as err:
        if warnings is None:
            raise ReportError(str(err)) from None
        warnings.append(str(err))
        return None


def _log_text(path: Path, within: Path) -> str:
    """A log or tool output in the run folder; undecodable bytes replaced (logs carry them)."""
    try:
        raw = safefile.read_bytes(path, "log", max_bytes=MAX_LOG_BYTES, within=within)
    except LauncherError as err:
        raise NcclParseError(str(path), str(err).removeprefix(f"{path}: ")) from None
    return raw.decode("utf-8", errors="replace")


def _rel(path: Path, run_dir: Path) -> str:
    return os.path.relpath(path, run_dir)


def facts_dirs() -> list[Path]:
    """Where `launch setup` put each cluster's node facts."""
    from launcher.core.home import launch_home

    return sorted((launch_home() / "clusters").glob("*/facts"))


def _node_facts(name: str, dirs: list[Path], warnings: list[str]) -> tuple[Path, dict] | None:
    """The newest facts file for a host of this name (clusters can share host names)."""
    found = [d / f"{name}.json" for d in dirs if (d / f"{name}.json").exists()]
    if not found:
        return None
    path = max(found, key=lambda p: p.stat().st_mtime)
    data = _record(NodeFacts, path, None, warnings, max_bytes=MAX_SMALL * 16)
    return (path, data) if data is not None else None


USER_JOBS = ("script", "module", "command")
# How a bench run's argv ends: launch's sweep (under train/ in run folders made before
# launch_bench/ existed, still reported as they were) or an nccl-tests binary (<op>_perf).
BENCH_ENTRIES = ("launch_bench/bench.py", "train/bench.py", "_perf")


def _workload(plan: dict) -> str:
    """"job" for the user's own script, module or command; "bench" for launch_bench/bench.py or an
    nccl-tests binary (<op>_perf); else "train"."""
    job = plan.get("job")
    if isinstance(job, dict) and job.get("kind") in USER_JOBS:
        return "job"
    argv = plan["nodes"][0].get("argv", []) if plan.get("nodes") else []
    bench = any(str(a).endswith(BENCH_ENTRIES) for a in argv)
    return "bench" if bench else "train"


def _topology(run_dir: Path, name: str, facts: tuple[Path, dict] | None
              ) -> tuple[Topology | None, str | None, list[str]]:
    """The node's `nvidia-smi topo -m`: a topology.txt in its folder, else the setup facts."""
    path = run_dir / name / "topology.txt"
    try:
        if safefile.lstat(path, within=run_dir.parent) is not None:
            return (parse_topology(_log_text(path, run_dir.parent), str(path)),
                    _rel(path, run_dir), [])
        if facts and facts[1].get("topology"):
            # .../clusters/<cluster>/facts/<node>.json: named without this machine's $HOME
            label = f"setup facts of cluster {facts[0].parent.parent.name}"
            return parse_topology(facts[1]["topology"], str(facts[0])), label, []
    except NcclParseError as err:
        return None, None, [f"{name}: topology not read: {err}"]
    return None, None, []


def _nccl_log(run_dir: Path, name: str) -> tuple[NcclDebugLog | None, list[str]]:
    """Every rank's NCCL_DEBUG file of the node, merged; empty files (NCCL opened the file but
    the rank died first) are skipped."""
    try:
        sources = []
        names = safefile.listdir(run_dir / name, within=run_dir.parent)
        for path in [run_dir / name / n for n in names if _NCCL_LOG.fullmatch(n)]:
            text = _log_text(path, run_dir.parent)
            if text.strip():
                sources.append((_rel(path, run_dir), text))
        return (parse_debug_logs(sources) if sources else None), []
    except NcclParseError as err:
        return None, [f"{name}: NCCL log not read: {err}"]


_NCCL_LOG = re.compile(r"nccl-debug\..+\.log")


def network_used(log: NcclDebugLog) -> str | None:
    """What carried this node's inter-node traffic: the NET/ transports NCCL connected over,
    else the network module it loaded."""
    nets = [t for t in log.transports if t.startswith("NET/")]
    if nets:
        return ", ".join(nets)
    return f"network {log.network}" if log.network else None


def _uses_efa(log: NcclDebugLog) -> bool:
    return bool(log.efa and "efa" in log.efa.provider) and any(
        "Libfabric" in t for t in [*log.transports, log.network or ""])


def _node_entry(run_dir: Path, node: dict, nnodes: int, dirs: list[Path]
                ) -> tuple[dict, Topology | None, list[str]]:
    name = node["name"]
    itype = node.get("instance_type")
    warnings: list[str] = []
    facts = _node_facts(name, dirs, warnings)
    topo, topo_source, topo_warnings = _topology(run_dir, name, facts)
    warnings += topo_warnings
    if topo is not None:
        interconnect = {"class": topo.link_class, "worst_link": topo.worst_link,
                        "source": topo_source}
    elif interconnect_class(itype):
        interconnect = {"class": interconnect_class(itype), "worst_link": None,
                        "source": f"catalog: {itype}"}
    else:
        interconnect = None
    log, log_warnings = _nccl_log(run_dir, name)
    warnings += log_warnings
    expected = efa_interfaces(itype)
    if expected is None and facts is not None:
        expected = facts[1].get("efa_devices")
    nccl = None
    efa = {"expected": expected, "used": None, "nics": None}
    if log is not None:
        nccl = {"version": log.nccl_version, "network": log.network,
                "transports": dict(log.transports), "channels": log.channels,
                "logs": len(log.paths)}
        efa.update(used=_uses_efa(log), nics=log.efa.nics if log.efa else None)
        if nnodes > 1 and expected:
            owner = itype or "this node"
            if not efa["used"]:
                used = network_used(log) or "no network it logged"
                warnings.append(f"{name}: {owner} has {expected} EFA interfaces but NCCL used "
                                f"{used}")
            elif efa["nics"] is not None and efa["nics"] < expected:
                warnings.append(f"{name}: {owner} has {expected} EFA interfaces but NCCL found "
                                f"{efa['nics']}")
    entry = {"name": name, "instance_type": itype, "gpus": node.get("gpus"),
             "interconnect": interconnect, "nccl": nccl, "efa": efa,
             "gloo_interface": (node.get("env") or {}).get("GLOO_SOCKET_IFNAME")}
    return entry, topo, warnings


def _bench_folders(run_dir: Path, names: list[str]) -> list[Path]:
    """bandwidth.json measured on the same nodes: this folder's own (a bench), else among its
    sibling run folders the newest all_reduce bench (what DDP's gradients use), else the newest
    of any collective."""
    runs = run_dir.parent
    own = run_dir / BANDWIDTH_JSON
    if safefile.lstat(own, within=runs) is not None:
        return [own]
    found = []
    for sibling in safefile.listdir(runs, within=runs.parent):
        path = runs / sibling / BANDWIDTH_JSON
        try:
            # A file of the user's beside the run folders (not a folder) is no bench either.
            info = safefile.lstat(path, within=runs) if sibling != run_dir.name else None
        except LauncherError:
            continue
        if info is None:
            continue
        try:
            nodes = read_record(PlanRecord, runs / sibling / "plan.json", within=runs).node_names
            doc = read_record(BandwidthRecord, path, within=runs)
        except LauncherError:
            continue  # a folder being written, or not one of ours: not a bench to quote
        if nodes == names:
            found.append(((doc.collective == "all_reduce", info.st_mtime), path))
    return [max(found)[1]] if found else []


def _bandwidth(run_dir: Path, names: list[str], bench: Path | None,
               types: list[str | None], transports_shown: bool) -> tuple[dict, list[str]]:
    paths = [bench] if bench is not None else _bench_folders(run_dir, names)
    if not paths:
        return {"source": None}, []
    path = paths[0]
    warnings: list[str] = []
    doc = _record(BandwidthRecord, path, None if bench is not None else run_dir.parent,
                  warnings)
    if doc is None:
        return {"source": None}, warnings
    itype = doc.get("instance_type") or next((t for t in types if t), None)
    written = doc.get("link_peak")
    comparison = compare(
        doc.get("collective"), points_of_json(doc.get("rows") or []),
        nnodes=doc.get("nnodes") or len(names), nranks=doc.get("ranks"), instance_type=itype,
        peak=LinkPeak(written["gbps"], written["label"]) if written else None)
    out = {"source": _rel(path, run_dir), "collective": doc.get("collective"),
           "peak_busbw": doc.get("peak_busbw"),
           "compared": comparison.to_json() if comparison else None,
           "wrong_total": doc.get("wrong_total")}
    if doc.get("wrong_total"):
        warnings.append(f"the bench counted {doc['wrong_total']} wrong elements: the collective "
                        "returned corrupt data; do not trust its timings")
    if comparison is not None and comparison.busbw_ratio < LOW_PEAK_RATIO:
        look = " (check the transports above)" if transports_shown else ""
        warnings.append(f"measured peak bus bandwidth {comparison.busbw:.2f} GB/s is "
                        f"{comparison.busbw_ratio:.0%} of {comparison.peak.label}: the links are "
                        f"not used at their speed{look}")
    return out, warnings


def _training(run_dir: Path, summary: dict | None, names: list[str],
              warnings: list[str]) -> dict | None:
    """The trainer's numbers: result.json of the node that held rank 0, else (a run that did
    not finish) the logged steps in metrics.jsonl. `split` is the mean step and its mean parts
    (train/stepsplit.py); `median_step_s` the step behind images/s."""
    rank0 = (summary or {}).get("rank0_node")
    for name in dict.fromkeys([rank0, *names] if rank0 else names):
        result = _record(ResultRecord, run_dir / name / "result.json", run_dir.parent, warnings)
        if result is not None:
            out = {"source": f"{name}/result.json",
                   "images_per_sec": result.get("images_per_sec"),
                   "median_step_s": result.get("step_time_s"),
                   "split": result.get("step_split"),
                   "comm_hook": (result.get("ddp") or {}).get("comm_hook"),
                   "auto": result.get("auto")}
            if "stragglers" in result:   # trainers before straggler detection have none
                out["stragglers"] = result["stragglers"]
                out["rank_times"] = result.get("rank_times") or []
            return out
    metrics = run_dir / "metrics.jsonl"
    if safefile.lstat(metrics, within=run_dir.parent) is None:
        return None
    try:
        records = [r.model_dump(exclude_unset=True) for r in read_lines(
            MetricsLine, metrics, within=run_dir.parent, problems=warnings)]
    except LauncherError as err:
        warnings.append(str(err))
        return None
    if not records:
        return None
    speeds = [r["images_per_sec"] for r in records if r.get("images_per_sec") is not None]
    # Each record's split covers its log interval: weighted by its steps, they combine into
    # the split of every logged step.
    parts = [r["split"] for r in records if isinstance(r.get("split"), dict)]
    split = split_of_totals(sum(p["steps"] for p in parts),
                            *(sum(p[key] * p["steps"] for p in parts)
                              for key in ("step_s", "data_wait_s", "comm_wait_s"))) \
        if parts else None
    return {"source": "metrics.jsonl",
            "images_per_sec": round(statistics.median(speeds), 3) if speeds else None,
            "median_step_s": None, "split": split, "comm_hook": None, "auto": None}


def _backend(run_dir: Path, nodes: list[dict]) -> str | None:
    for node in nodes:
        for name in ("result.json", RESULTS_FILE):
            data = _record(BackendRecord, run_dir / node["name"] / name, run_dir.parent,
                           [])  # _training warns
            if data and data.get("backend"):
                return data["backend"]
    if not nodes:
        return None
    return "nccl" if any(n.get("gpus") for n in nodes) else "gloo"


def run_folder(path: str | Path) -> Path:
    """The run folder as an absolute path whose last part is the folder itself: never a link
    (the report is written into it), its parent resolved (a runs folder may be a link)."""
    path = safefile.check_folder(Path(path), "run folder")
    return path.absolute().parent.resolve() / path.absolute().name


def plan_and_summary(run_dir: Path, warnings: list[str]) -> tuple[dict, dict | None]:
    """plan.json (needed: ReportError without it) and summary.json (None when absent or
    unreadable, a warning then), as the report reads them."""
    plan_path = run_dir / "plan.json"
    if safefile.lstat(plan_path, within=run_dir.parent) is None:
        raise ReportError(f"{run_dir}: no plan.json, so not a run folder launch wrote; pass "
                          "runs/<run_id>")
    plan = _record(PlanRecord, plan_path, run_dir.parent, None)
    return plan, _record(SummaryRecord, run_dir / "summary.json", run_dir.parent, warnings)


def build_report(run_dir: str | Path, *, bench: str | Path | None = None,
                 facts_from: list[Path] | None = None) -> dict[str, Any]:
    """The report as a JSON-able dict. `bench` names a bandwidth.json to quote (default: the
    folder's own, else the newest sibling bench on the same nodes)."""
    run_dir = run_folder(run_dir)
    warnings: list[str] = []
    plan, summary = plan_and_summary(run_dir, warnings)
    nodes = plan.get("nodes") or []
    names = [n["name"] for n in nodes]
    dirs = facts_dirs() if facts_from is None else facts_from
    entries, topologies = [], {}
    for node in nodes:
        entry, topo, node_warnings = _node_entry(run_dir, node, len(nodes), dirs)
        entries.append(entry)
        warnings += node_warnings
        if topo is not None:
            topologies[node["name"]] = topo
    types = [n.get("instance_type") for n in nodes]
    warnings += advice.topology_differences(topologies, dict(zip(names, types)))
    versions = {e["name"]: e["nccl"]["version"] for e in entries if e["nccl"]}
    if len(set(versions.values())) > 1:
        warnings.append("nodes run different NCCL versions: " + ", ".join(
            f"{name} {version}" for name, version in versions.items()))
    bandwidth, bench_warnings = _bandwidth(
        run_dir, names, Path(bench).resolve() if bench else None, types,
        _transports_shown(entries))
    warnings += bench_warnings
    workload = _workload(plan)
    training = _training(run_dir, summary, names, warnings) if workload == "train" else None
    for slow in (training or {}).get("stragglers") or []:
        warnings.append(f"straggler: node {slow['node']} rank {slow['rank']}: its compute was "
                        f"{slow['ratio']:g}x the median rank's for {slow['intervals']} log "
                        "intervals: every step waited for it")
    backend = _backend(run_dir, nodes)
    kind = advice.link_kind([n.get("private_address") or n.get("address") or n["name"]
                             for n in nodes],
                            [t for e in entries if e["nccl"] for t in e["nccl"]["transports"]],
                            backend)
    facts = summary_facts(plan, summary)
    report = {
        "run_id": plan.get("run_id", run_dir.name),
        "status": facts.pop("status"),
        "workload": workload,
        "backend": backend,
        "nnodes": len(nodes),
        "world_size": plan.get("world_size"),
        "nodes": entries,
        "bandwidth": bandwidth,
        "training": training,
        "link": kind,
        "warnings": warnings,
        "advice": _advice(entries, training, kind),
    }
    if "failure" in facts:
        report["advice"] = [_failure_advice(facts["failure"], report["run_id"]),
                            *report["advice"]]
    report.update(facts)
    if (summary or {}).get("timeline"):   # runs written before launch kept one lack the key
        report["timeline"] = summary["timeline"]
    return report


SUMMARY_FACTS = ("status", "failure", "job", "recovery")


def summary_facts(plan: dict, summary: dict | None) -> dict[str, Any]:
    """What the report states from summary.json besides its timeline (SUMMARY_FACTS, each
    only when the run has it): the one place they are derived, so that a report can be told
    current against its summary (launcher/report/retime.py)."""
    facts: dict[str, Any] = {"status": (summary or {}).get("status", "unknown")}
    failure = _failure(summary)
    if failure is not None:   # only a run that did not succeed carries the key
        facts["failure"] = failure
    if _workload(plan) == "job":   # only a run of the user's own job carries the key
        facts["job"] = _job(plan, summary)
    recovery = _recovery(summary)
    if recovery is not None:  # only runs that restarted, hung or resumed carry the key
        facts["recovery"] = recovery
    return facts


def _failure(summary: dict | None) -> dict | None:
    """How the run ended when it did not succeed (summary.json's failure): where, why, and the
    lines launch chose from the node's log (the failing rank's exception first)."""
    summary = summary or {}
    failure = summary.get("failure")
    if summary.get("status") in (None, "succeeded") or not isinstance(failure, dict):
        return None
    node = failure.get("first_failed_node")
    return {"status": summary.get("status"), "node": node, "reason": failure.get("reason"),
            "excerpt": list(failure.get("last_lines") or []),
            "hints": list(failure.get("hints") or []),
            "log": f"{node}/node.log" if node else None,
            # node -> why its machine is gone (the fleet said so): nothing in a log to fix.
            "lost": dict(summary.get("lost") or {})}


def _failure_advice(failure: dict, run_id: str) -> str:
    if failure["status"] == "interrupted":
        return (f"the run was stopped ({failure['reason']}): `launch run --resume {run_id}` "
                "continues it from its last checkpoint")
    lost = failure.get("lost") or {}
    if lost:
        gone = "; ".join(f"{node}: {why}" for node, why in lost.items())
        return (f"the run {failure['status']}: a machine is gone ({gone}); `launch run "
                f"--resume {run_id} --recover` replaces it and continues from the last "
                "checkpoint (with checkpoint.mirror, a lost head's too); a run started with "
                "--recover does this by itself")
    where = f" on node {failure['node']}" if failure["node"] else ""
    log = f" (its whole log: `{failure['log']}`)" if failure["log"] else ""
    return (f"the run {failure['status']}{where}: fix what the lines under Failure show{log}, "
            f"then `launch run --resume {run_id}` continues from the last checkpoint")


def _job(plan: dict, summary: dict | None) -> dict:
    """What launch knows of a user's own job: what ran, how long, and the steps it reported
    (LAUNCH_STEP lines, when it printed any): nothing of the trainer's is invented."""
    summary = summary or {}
    progress = summary.get("progress") if isinstance(summary.get("progress"), dict) else None
    return {"kind": plan["job"].get("kind"), "target": plan["job"].get("target"),
            "args": plan["job"].get("args") or [], "duration_s": summary.get("duration_s"),
            "progress": progress,
            # Where the job ran on each node, and what it wrote stays (its own folder).
            "folders": {n["name"]: n["job_dir"] for n in plan.get("nodes") or []
                        if n.get("job_dir")}}


def _recovery(summary: dict | None) -> dict | None:
    """What the run restarted after, and the hang it found (summary.json), if anything."""
    summary = summary or {}
    keys = ("attempt", "resumed_from_step", "restarts", "hang")
    if not summary.get("restarts") and not summary.get("hang") and \
            not summary.get("resumed_from_step"):
        return None
    job = summary.get("job") if isinstance(summary.get("job"), dict) else {}
    return {**{key: summary.get(key) for key in keys},
            "user_job": job.get("kind") in USER_JOBS}


def _straggler_advice(training: dict | None) -> list[str]:
    nodes = list(dict.fromkeys(s["node"] for s in (training or {}).get("stragglers") or []))
    if not nodes:
        return []
    where = ",".join(nodes)
    return [f"look at {', '.join(nodes)} before the next run: `launch check -i INVENTORY "
            f"--limit {where}` "
            "(throttle, xid, ecc columns), other processes on it (`top`), a slower data path "
            "(data_wait_s in summary.json's rank_times); or leave it out with --limit"]


def _transports_shown(entries: list[dict]) -> bool:
    """Whether the nodes table lists NCCL transports a message may point at."""
    return any(e["nccl"] and e["nccl"]["transports"] for e in entries)


def _advice(entries: list[dict], training: dict | None, kind: str | None) -> list[str]:
    out = _straggler_advice(training)
    if len(entries) > 1 and any(e["efa"]["expected"] and e["efa"]["used"] is False
                                for e in entries):
        out.append("make NCCL use EFA: the aws-ofi-nccl plugin must load (`launch setup`, role "
                   "efa; FI_PROVIDER=efa in the node's /etc/launch/nccl.env) and the security "
                   "group must allow all traffic between its own members")
    if training and training.get("split"):
        # The run measured its own steps: that, not the wiring's rule of thumb, decides.
        return out + advice.training_advice(training["split"], training.get("comm_hook"),
                                            training.get("auto"), kind,
                                            _transports_shown(entries))
    classes = [e["interconnect"]["class"] for e in entries if e["interconnect"]]
    logs = [e for e in entries if e["nccl"]]
    fast = None
    if len(entries) > 1 and logs:
        fast = all(e["efa"]["used"] or any(t.startswith("NET/IB") for t in e["nccl"]["transports"])
                   for e in logs)
    return out + advice.wiring_advice(advice.slowest_class(classes), len(entries), fast)


# ----------------------------------------------------------------------------- rendering


def _gb(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f} GB/s"


def _node_row(entry: dict, backend: str | None, nnodes: int) -> str:
    ic = entry["interconnect"]
    if ic:
        worst = f", worst link {ic['worst_link']}" if ic["worst_link"] else ""
        interconnect = f"{ic['class']}{worst} ({ic['source']})"
    elif not entry["gpus"]:
        interconnect = "none: CPU node"
    else:
        interconnect = "unknown (no topology.txt, facts or instance type)"
    nccl = entry["nccl"]
    if nccl:
        version = nccl["version"] or "version not logged"
        transports = ", ".join(f"{t} x{n}" for t, n in nccl["transports"].items())
        network = f"{nccl['network'] or 'not logged'}; {transports or 'no connection logged'}"
    elif backend == "gloo":
        version = "not used (gloo)"
        iface = entry.get("gloo_interface")
        network = f"gloo over TCP{f' ({iface})' if iface else ''}"
    else:
        version = "no NCCL_DEBUG logs"
        network = "unknown"
    efa = entry["efa"]
    if efa["expected"] is None and efa["used"] is None:
        efa_cell = "n/a"
    elif nnodes == 1:
        efa_cell = "not needed (one node)"
    else:
        expected = "?" if efa["expected"] is None else str(efa["expected"])
        used = ("not logged" if efa["used"] is None
                else f"yes ({efa['nics']} NICs)" if efa["used"] else "no")
        efa_cell = f"{expected} / {used}"
    cells = [entry["name"], entry["instance_type"] or "unknown", str(entry["gpus"] or 0),
             interconnect, version, network, efa_cell]
    return "| " + " | ".join(cells) + " |"


def render_markdown(report: dict, *, color: bool = False) -> str:
    """report.md; with `color`, warnings in red for a terminal."""
    lines = [
        f"# Run report: {report['run_id']}",
        "",
        f"{report['status']} · {report['workload']} · backend {report['backend'] or 'unknown'} "
        f"· {report['nnodes']} node(s), world size {report['world_size']}",
        "",
        *_failure_lines(report.get("failure")),
        *_time_lines(report.get("timeline")),
        "## Nodes",
        "",
        "| node | instance type | GPUs | interconnect | NCCL | network; transports "
        "(connections) | EFA expected / used |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    lines += [_node_row(entry, report["backend"], report["nnodes"])
              for entry in report["nodes"]]
    lines += ["", "## Bus bandwidth", ""]
    bw = report["bandwidth"]
    if bw["source"] is None:
        lines.append("None measured on these nodes: run `launch bench` with the same nodes "
                     "(its bandwidth.json is quoted here by later runs).")
    else:
        compared = bw["compared"]
        if compared is None:
            against = (f"{bw['collective']}: peak busbw {_gb(bw['peak_busbw'])} (no link peak "
                       "to compare with: the instance type is not known)")
        else:
            peak = compared["link_peak"]
            against = (f"{bw['collective']}: {compared['figure']} {_gb(compared['measured'])} "
                       f"at {human_bytes(compared['size'])} = {compared['ratio']:.0%} of the "
                       f"catalog's {peak['label']} ({compared['basis']})")
            if compared["figure"] != "busbw":
                against += f"; peak busbw {_gb(bw['peak_busbw'])}"
                if compared["above_line_rate"]:
                    against += (", above the network's line rate: NCCL's tree algorithm sends "
                                "less across nodes than busbw assumes (NCCL_ALGO=Ring measures "
                                "the ring)")
        lines.append(f"{against}; from {bw['source']}.")
    tr = report["training"]
    lines += ["", "## Job" if report["workload"] == "job" else "## Training", ""]
    if report["workload"] == "job":
        lines += _job_lines(report["job"])
    elif report["workload"] == "bench":
        lines.append("A bench run: no training.")
    elif tr is None:
        lines.append("No training step was logged.")
    else:
        speed = ("n/a" if tr["images_per_sec"] is None
                 else f"{tr['images_per_sec']:.1f} images/s")
        step = ("" if tr["median_step_s"] is None
                else f" (median step {tr['median_step_s']:.4f} s)")
        lines.append(f"{speed}{step}, from {tr['source']}.")
        if tr["split"]:
            lines.append(split_sentence(tr["split"], tr["comm_hook"]))
        for slow in tr.get("stragglers") or []:
            lines.append(f"Straggler: node {slow['node']} rank {slow['rank']}: compute "
                         f"{slow['ratio']:g}x the median rank's for {slow['intervals']} log "
                         "intervals; every step waited for it.")
        ranks = [r for r in tr.get("rank_times") or [] if "step_s" in r]
        if ranks and len(ranks) <= 16:
            lines.append("Per rank, mean step = compute + data wait + communication wait: "
                         + "; ".join(f"{r['node']} rank {r['rank']} {_parts(r)}" for r in ranks)
                         + ".")
        auto = tr.get("auto")
        if auto:
            lines.append(_auto_sentence(auto))
    if report.get("recovery"):
        lines += ["", "## Restarts and hangs", ""] + _recovery_lines(report["recovery"])
    if report["warnings"]:
        lines += ["", "## Warnings", ""]
        for warning in report["warnings"]:
            text = f"- warning: {printable(warning)}"
            lines.append(f"{RED}{text}{RESET}" if color else text)
    lines += ["", "## What to change", ""]
    if report["advice"]:
        lines += [f"- {item}" for item in report["advice"]]
    elif report["warnings"]:
        lines.append("- see the warnings above")
    else:
        lines.append("- nothing: no sign that the links hold this run back")
    # Text from the run folder's files (names, reasons, NCCL's words) reaches the terminal:
    # control characters are shown escaped; the warnings' own colour is added above.
    return "\n".join(line if line.startswith(RED) else printable(line)
                     for line in lines) + "\n"


def time_markdown(timeline: dict | None) -> str:
    """report.md's Time section as render_markdown writes it (its lines, each ended; nothing
    without a timeline)."""
    return "".join(printable(line) + "\n" for line in _time_lines(timeline))


def _time_lines(timeline: dict | None) -> list[str]:
    """Where the wall time went (summary.json `timeline`): goodput, the largest losses, every
    phase."""
    if not timeline:
        return []
    return ["## Time", "", describe_timeline(timeline) + ".", "",
            "| phase | seconds | share |", "| --- | --- | --- |",
            *(f"| {p['name']} | {p['s']:.2f} | {_share(p['s'], timeline['wall_s'])} |"
              for p in timeline.get("phases") or []),
            *(f"| - of which lost: {loss['what']} | {loss['s']:.2f} | "
              f"{_share(loss['s'], timeline['wall_s'])} |"
              for loss in timeline.get("training_losses") or []), ""]


def _share(part: float, whole: float) -> str:
    return f"{part / whole:.1%}" if whole else "-"


def _failure_lines(failure: dict | None) -> list[str]:
    """The section a report of a failed run leads with."""
    if failure is None:
        return []
    where = f"Node {failure['node']}: " if failure["node"] else ""
    lines = ["## Failure", "", f"{where}{failure['reason'] or failure['status']}.", ""]
    if failure["excerpt"]:
        lines += ["Its last lines, the failing rank's own error first"
                  + (f" (all of them in `{failure['log']}`):" if failure["log"] else ":"),
                  "", "```", *failure["excerpt"], "```", ""]
    lines += [f"- {hint}" for hint in failure["hints"]]
    return lines + ([""] if failure["hints"] else [])


def _s(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds:.4f} s"


def _job_lines(job: dict) -> list[str]:
    what = {"script": f"script {job['target']}", "module": f"module {job['target']}",
            "command": "command"}.get(job["kind"], str(job["kind"]))
    args = f" with {len(job['args'])} argument(s)" if job["args"] else ""
    took = "" if job["duration_s"] is None else f"; the run took {job['duration_s']:.1f} s"
    lines = [f"Your {what}{args}{took}."]
    folders = job.get("folders") or {}
    if folders:
        lines.append("It ran in a folder of its own on each node, where what it wrote stays "
                     "(docs/workdir.md): " + "; ".join(f"{node} `{path}`"
                                                        for node, path in folders.items())
                     + ".")
    progress = job.get("progress")
    if not progress:
        lines.append("It printed no LAUNCH_STEP line, so launch knows no step, loss or per-rank "
                     "time of it (one print per step opts in: docs/jobs.md).")
        return lines
    loss = "" if progress.get("loss") is None else f", last loss {progress['loss']:g}"
    lines.append(f"It reported reaching step {progress['step']}{loss} "
                 f"({progress['lines']} LAUNCH_STEP line(s)).")
    for slow in progress.get("stragglers") or []:
        lines.append(f"Straggler: node {slow['node']} local rank {slow['local_rank']}: its busy "
                     f"time was {slow['ratio']:g}x the median rank's for {slow['intervals']} "
                     f"blocks of {slow['block_steps']} steps: every step waited for it.")
    return lines


def _auto_sentence(auto: dict) -> str:
    """comm_hook auto's outcome with its evidence (train/autocomm.py's reason)."""
    used = auto.get("last_steps_used", "all-reduce")
    if auto.get("decided_at_step") is None:
        return (f"comm_hook auto is undecided: {auto['reason']}; the last steps used {used}. "
                "Give the run more steps for auto to choose.")
    what = {"powersgd": "chose PowerSGD", "none": "kept plain all-reduce",
            "undecided": "could not tell and kept plain all-reduce"}.get(auto["choice"],
                                                                        auto["choice"])
    return f"comm_hook auto {what} after step {auto['decided_at_step']}: {auto['reason']}."


def _parts(split: dict) -> str:
    return (f"{split['step_s']:.4f} s = {split['compute_s']:.4f} + {split['data_wait_s']:.4f} "
            f"+ {split['comm_wait_s']:.4f} s")


def split_sentence(split: dict, comm_hook: str | None) -> str:
    """The step split as the report states it: the parts printed beside their whole."""
    return (f"A step takes {split['step_s']:.4f} s on average = {split['compute_s']:.4f} s "
            f"compute + {split['data_wait_s']:.4f} s data wait + {split['comm_wait_s']:.4f} s "
            f"waiting on communication ({split['statistic']}s over {split['steps']} "
            f"steps): {split['comm_share']:.0%} of step time waits on communication "
            f"(comm hook {comm_hook or 'unknown'}).")


def _recovery_lines(recovery: dict) -> list[str]:
    lines = []
    if recovery.get("resumed_from_step"):
        lines.append(f"- attempt {recovery.get('attempt')} resumed from checkpoint step "
                     f"{recovery['resumed_from_step']} (`launch run --resume`)")
    for r in recovery.get("restarts") or []:
        if not r.get("restarted", True):
            lines.append(f"- failure after {r['at_time_s']:.1f} s, node {r['node']} "
                         f"({r['kind']}): {r['reason']}; no restart left: the run stopped")
            continue
        lost = "" if r["steps_lost"] is None else f", {r['steps_lost']} step(s) redone"
        back = ("" if r["recovered_in_s"] is None
                else f", training again {r['recovered_in_s']:.1f} s later")
        lines.append(f"- restart after {r['at_time_s']:.1f} s, node {r['node']} ({r['kind']}): "
                     f"{r['reason']}; {_resumed(r, recovery.get('user_job'))}{lost}{back}")
    hang = recovery.get("hang")
    if hang:
        stuck = ", ".join(f"rank {v['rank']} on {v['node']} ({v['state']}, at {v['frame']})"
                          for v in hang["stuck"]) or "none stood out"
        waiting = ", ".join(f"rank {v['rank']} on {v['node']}" for v in hang["in_collective"])
        lines.append(f"- hang at {hang['detected_at_s']:.1f} s (no step for "
                     f"{hang['idle_s']:.0f} s, timeout {hang['timeout_s']:g} s): stuck: {stuck}"
                     + (f"; waiting in a collective: {waiting}" if waiting else "")
                     + f"; then {hang['action']}. Stacks: "
                     + ", ".join(f"`{d}`" for d in hang["dumps"]))
    return lines


def _resumed(restart: dict, user_job: bool | None) -> str:
    """What is known of where the job went on after a restart: the trainer says which
    checkpoint it loaded; a job of the user's own says nothing, but its LAUNCH_STEP lines
    show where it went on."""
    if restart["resumed_from_step"] is not None:
        return ("started over from step 0" if restart["resumed_from_step"] == 0 else
                f"resumed from step {restart['resumed_from_step']}")
    if not user_job:
        return "not resumed"
    after, before = restart.get("next_step"), restart.get("reached_step")
    if after is None:
        return ("where the job went on is its own to know (no LAUNCH_STEP line after the "
                "restart)")
    had = f" (it had reported step {before})" if before is not None else ""
    if after <= 1:
        return f"its next LAUNCH_STEP was step {after}{had}: it started over"
    return (f"its next LAUNCH_STEP was step {after}{had}: it went on from a checkpoint of "
            "its own")


def checked_report(run_dir: str | Path, *, bench: str | Path | None = None) -> dict:
    """build_report, with a foreign run folder named instead of a traceback."""
    try:
        return build_report(run_dir, bench=bench)
    except (KeyError, TypeError, AttributeError, IndexError) as err:
        # A hand-edited or foreign plan.json/summary.json: say which, not where it broke.
        raise ReportError(f"{run_dir}: plan.json or summary.json is not what launch writes "
                          f"({type(err).__name__}: {shorten(str(err), 120)}); the run's logs "
                          "are still in its node folders") from None


def write_run_report(run_dir: str | Path, *, bench: str | Path | None = None) -> dict:
    """Writes report.json, report.md and report.html into the run folder; returns the
    report."""
    run_dir = run_folder(run_dir)
    report = checked_report(run_dir, bench=bench)
    markdown = render_markdown(report)
    try:
        for name, text in ((REPORT_JSON, json.dumps(report, indent=2) + "\n"),
                           (REPORT_MD, markdown)):
            safefile.write_text(run_dir / name, text, within=run_dir.parent)
        write_report_html(run_dir, report, markdown)
    except LauncherError as err:
        raise ReportError(f"{run_dir}: cannot write the report there: {err}") from None
    return report


def job_folder_lines(folders: dict[str, str], run_dir: str | Path) -> list[str]:
    """Where each node's job ran, and what it wrote stays (checkpoints, logs), not in the next
    run's folder: a line per node as far as the terminal shows every node's lines
    (runs/screen.py); beyond, the head's and where the others are listed (256 lines at the end
    of a 256-node run would bury its result)."""
    items = list(folders.items())
    shown = items if len(items) <= SCREEN_ALL_NODES else items[:1]
    lines = [f"launch: job folder of {printable(node)}: {printable(path)}" for node, path in shown]
    if len(shown) < len(items):
        lines.append(f"launch: the job folders of the other {len(items) - len(shown)} node(s) "
                     f"are in {Path(run_dir) / REPORT_MD} (Job)")
    if items:
        run = Path(run_dir)
        where = "" if run.parent.resolve() == Path("runs").resolve() \
            else f" --runs-dir {shlex.quote(printable(str(run.parent)))}"
        lines.append(f"launch: what the job wrote there comes here with `launch fetch "
                     f"{printable(run.name)} --workdir{where}` (into {printable(str(run))}"
                     "/workdir/NODE/)")
    return lines


def print_run_report(run_dir: str | Path, stream: TextIO | None = None) -> dict:
    """After a run: where the report is, then its warnings (red on a terminal) and advice;
    returns the report."""
    stream = stream or sys.stdout
    report = write_run_report(run_dir)
    color = stream.isatty()
    stream.write(f"launch: report in {Path(run_dir) / REPORT_MD}; with plots: "
                 f"{Path(run_dir) / REPORT_HTML}\n")
    for line in job_folder_lines((report.get("job") or {}).get("folders") or {}, run_dir):
        stream.write(line + "\n")
    for warning in report["warnings"]:
        text = f"launch: warning: {printable(warning)}"
        stream.write(f"{RED}{text}{RESET}\n" if color else text + "\n")
    for item in report["advice"]:
        stream.write(f"launch: advice: {printable(item)}\n")
    stream.flush()
    return report
