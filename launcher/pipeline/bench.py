"""`launch bench`'s torch.distributed sweep, run: launch_bench/bench.py started on every node
through the pipeline like any run, its results turned into nccl-tests' table, bandwidth.json,
bandwidth.png and the run report (`launch bench`, and `launch run --bench` before a run, on the
run's own nodes).
"""

from __future__ import annotations

from pathlib import Path

from launcher.cluster.inventory import Node
from launcher.core.errors import RunFailed
from launcher.execute.attempt import run_attempt
from launcher.job.request import RunRequest
from launcher.job.recipe import Recipe, recipe_from_mapping
from launcher.job.spec import workload
from launcher.nccl import sweep
from launcher.nccl.compare import bench_verdict
from launcher.nccl.links import facts, link_peak
from launcher.nccl.nccl_tests import parse_nccl_tests
from launcher.nccl.plot import plot_bandwidth
from launcher.report.build import write_run_report
from launcher.runs.folder import RunFolder, check_run_id


def bench_recipe(count: int, local: bool) -> Recipe:
    """The launch path needs a recipe for rendezvous, env and processes per node; a bench has
    no training, so `train` is a placeholder the program never reads."""
    timeout = {"timeout": 60} if local else {}  # a local rendezvous forms in seconds
    return recipe_from_mapping({"name": "bench", "nodes": count, "rendezvous": timeout,
                                "train": {"steps": 1}}, "<launch bench>")


def bench_request(backend, count: int, run_id: str, runs_dir: str, grace_s: float, *,
                  op: str, sizes: list[int], dtype: str, warmup_iters: int,
                  iters: int) -> RunRequest:
    """One sweep as a run of its own."""
    job = workload("launch_bench/bench.py",
                   *sweep.bench_args(op, sizes, dtype, warmup_iters, iters))
    return RunRequest(bench_recipe(count, local=backend.capabilities.one_machine), run_id,
                      count, job=job, runs_dir=runs_dir, grace_s=grace_s)


def instance_type_of(nodes: list[Node]) -> str | None:
    """The peak line needs one type; mixed nodes get none rather than a wrong one."""
    types = {n.instance_type for n in nodes}
    return types.pop() if len(types) == 1 else None


def gpus_of(node: Node) -> int:
    if node.gpus is not None:
        return node.gpus
    row = facts(node.instance_type)
    return row.gpu_count if row else 0


def bench_before_run(backend, request: RunRequest, nodes: list[Node], start=None) -> int:
    """`launch run --bench`: the default all-reduce sweep on the run's nodes, in a run folder
    of its own beside the run's (RUN_ID-bench), whose bandwidth.json the run's report quotes."""
    high = sweep.default_max_bytes(backend.gpus(nodes))
    run_id = check_run_id(f"{request.run_id[:120]}-bench")
    bench = bench_request(backend, len(nodes), run_id, request.runs_dir, request.grace_s,
                          op="all_reduce", sizes=sweep.sweep_sizes(sweep.DEFAULT_MIN_BYTES, high),
                          dtype="float", warmup_iters=sweep.WARMUP_ITERS, iters=sweep.ITERS)
    summary = (start or (lambda req, on: run_attempt(backend, req, on)))(bench, nodes)
    return finish_sweep(Path(request.runs_dir).resolve() / run_id,
                        [n["name"] for n in summary["nodes"]], summary["nproc_per_node"],
                        instance_type_of(nodes))


def finish_sweep(run_dir: Path, names: list[str], nproc: int, instance_type: str | None) -> int:
    """The sweep's results (rank 0's node folder) as nccl-tests' table, then `finish`."""
    results = sweep.load_results(sweep.find_results(run_dir, names))
    comment = (f"launch bench: torch.distributed {results['op']}, backend "
               f"{results['backend']}, {len(names)} node(s) x {nproc} rank(s), torch "
               f"{results.get('torch')}")
    return finish(run_dir, sweep.results_table(results, comment),
                  source="launch bench (torch.distributed)", backend=results["backend"],
                  dtype=results["dtype"], nnodes=len(names), instance_type=instance_type)


def finish(run_dir: Path, text: str, *, source: str, backend: str | None, dtype: str,
           nnodes: int, instance_type: str | None) -> int:
    """Print the table (nccl-tests' layout); write bandwidth.txt/.json/.png; refresh the
    report so that it quotes them."""
    print(text, end="", flush=True)
    table_path = run_dir / "bandwidth.txt"
    table_path.write_text(text)
    run = parse_nccl_tests(text, str(table_path))
    peak = link_peak(instance_type, nnodes)
    doc = sweep.bandwidth_document(run, source=source, run_id=run_dir.name, nnodes=nnodes,
                                   instance_type=instance_type, peak=peak, backend=backend,
                                   dtype=dtype)
    RunFolder(run_dir).write_json("bandwidth.json", doc)
    where = f"{nnodes} node(s), {backend or 'NCCL'}"
    plot_bandwidth(run, run_dir / "bandwidth.png", peak=peak,
                   title=f"{run.collective} bus bandwidth, {where} ({run_dir.name})")
    try:
        write_run_report(run_dir)
    except Exception as err:  # noqa: BLE001 (the measurement stands without its report)
        print(f"launch: warning: no run report ({type(err).__name__}: {err})")
    if doc["peak_busbw"] is None:
        print("launch: the table holds no bus bandwidth (every time was N/A)")
    else:
        print("launch: " + bench_verdict(run, nnodes=nnodes, instance_type=instance_type,
                                         peak=peak))
    print(f"launch: bandwidth.txt, bandwidth.json, bandwidth.png and report.md in {run_dir}")
    if run.wrong_total:
        raise RunFailed(f"{run.wrong_total} wrong elements: the collective returned corrupt "
                        f"data; the timings in {run_dir} are not to be trusted")
    return 0
