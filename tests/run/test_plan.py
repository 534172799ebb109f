"""Exact expected plans: argv and env per node, for 1, 2 and 4 nodes, with and without GPUs."""

from __future__ import annotations

import json
import shlex

import pytest

from launcher.cluster.inventory import Node
from launcher.job.recipe import recipe_from_mapping
from launcher.job.runplan import Placement, plan_run

RECIPE = {
    "name": "exp",
    "nodes": 2,
    "rendezvous": {"port": 29400, "timeout": 300},
    "env": {"TORCH_SHOW_CPP_STACKTRACES": 1},
    "train": {"model": "vit_b16", "dataset": "synthetic", "image_size": 224, "patch_size": 16,
              "batch_size": 64, "steps": 100, "lr": 1e-3, "precision": "bf16"},
    "ddp": {"static_graph": True, "gradient_as_bucket_view": True, "bucket_cap_mb": 100,
            "comm_hook": "powersgd", "powersgd": {"rank": 4, "start_iter": 20}},
}

TRAINER_ARGS = [
    "--model", "vit_b16", "--dataset", "synthetic", "--image-size", "224", "--patch-size", "16",
    "--batch-size", "64", "--steps", "100", "--lr", "0.001", "--weight-decay", "0.05",
    "--precision", "bf16", "--seed", "0", "--grad-accum-steps", "1", "--num-workers", "0",
    "--log-every", "10", "--no-save-model", "--static-graph", "--gradient-as-bucket-view",
    "--bucket-cap-mb",
    "100.0", "--comm-hook", "powersgd", "--powersgd-rank", "4", "--powersgd-start-iter", "20",
    "--powersgd-warm-start", "--powersgd-error-feedback", "--powersgd-wire", "bf16",
    "--powersgd-hook", "launch",
]


def cluster(n: int, gpus: int) -> list[Node]:
    return [Node(name=f"gpu{i}", address=f"54.0.0.{i + 1}", private_address=f"10.0.0.{i + 1}",
                 gpus=gpus, python="/opt/launch/venv/bin/python", interface="ens5")
            for i in range(n)]


def placements(nodes, cpus=None):
    return {n.name: Placement(python=n.python, code_dir="/srv/run/code",
                              run_dir=f"/srv/run/{n.name}", cpus=cpus) for n in nodes}


def expected_argv(n: int, nproc: int, node_index: int) -> list[str]:
    return [
        "/opt/launch/venv/bin/python", "-m", "torch.distributed.run",
        "--nnodes", str(n), "--nproc-per-node", str(nproc),
        "--rdzv-backend", "c10d", "--rdzv-endpoint", "10.0.0.1:29400", "--rdzv-id", "run-7",
        # The store runs in a process of its own on the head: every agent is a client.
        "--rdzv-conf", "is_host=0,join_timeout=300",
        "--local-addr", f"10.0.0.{node_index + 1}", "--max-restarts", "0",
        "--tee", "3", "--log-dir", f"/srv/run/gpu{node_index}/torchrun",
        # Every rank starts in launch's worker entry, which then becomes the trainer (exec).
        "/srv/run/code/launch_node/worker.py", "script",
        "/srv/run/code/train/main.py", *TRAINER_ARGS, "--out-dir", f"/srv/run/gpu{node_index}",
    ]


def expected_env(node_index: int, omp: str | None, gpus: int = 0, n: int = 1) -> dict[str, str]:
    env = {"LAUNCH_RUN_ID": "run-7", "LAUNCH_NODE": f"gpu{node_index}", "PYTHONUNBUFFERED": "1",
           "LAUNCH_PYTHON": "/opt/launch/venv/bin/python"}
    if omp:
        env["OMP_NUM_THREADS"] = omp
    env.update({
        "NCCL_DEBUG": "INFO",
        "NCCL_DEBUG_FILE": f"/srv/run/gpu{node_index}/nccl-debug.%h.%p.log",
        "GLOO_SOCKET_IFNAME": "ens5", "NCCL_SOCKET_IFNAME": "ens5",
    })
    if gpus:  # NCCL's flight recorder, for hang forensics
        env.update({
            "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
            "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": f"/srv/run/gpu{node_index}/hang/nccl-trace.rank",
            "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": f"/srv/run/gpu{node_index}/hang/nccl-trace.rank",
        })
    env["TORCH_SHOW_CPP_STACKTRACES"] = "1"
    # Where the other nodes are (docs/jobs.md), and the run's attempt.
    env.update({
        "LAUNCH_NODE_RANK": str(node_index), "LAUNCH_NUM_NODES": str(n),
        "LAUNCH_NODE_ADDRS": ",".join(f"10.0.0.{i + 1}" for i in range(n)),
        "LAUNCH_HEAD_ADDR": "10.0.0.1", "LAUNCH_RDZV_PORT": "29400",
        "LAUNCH_GPUS_PER_NODE": str(gpus), "LAUNCH_ATTEMPT": "0",
    })
    return env


@pytest.mark.parametrize("n", [1, 2, 4])
@pytest.mark.parametrize("gpus,cpus,nproc,omp", [(8, 96, 8, "12"), (0, 4, 1, "4"),
                                                  (0, None, 1, None)])
def test_plan_is_exactly_one_torchrun_per_node(n, gpus, cpus, nproc, omp):
    recipe = recipe_from_mapping(RECIPE, "exp.yml")
    nodes = cluster(n, gpus)
    plan = plan_run(recipe, nodes, "run-7", placements(nodes, cpus))
    assert plan.world_size == n * nproc
    assert plan.rdzv_endpoint == "10.0.0.1:29400"
    assert [c.is_head for c in plan.nodes] == [True] + [False] * (n - 1)
    for i, command in enumerate(plan.nodes):
        assert list(command.argv) == expected_argv(n, nproc, i)
        assert command.env == expected_env(i, omp, gpus, n)
        assert list(command.probe) == ["/opt/launch/venv/bin/python", "-S",
                                       "/srv/run/code/launch_node/node_probe.py"]
    assert plan.recovery.restarts == 0 and plan.recovery.hang_timeout_s is None
    assert plan.store.name == "gpu0"
    assert list(plan.store.argv) == ["/opt/launch/venv/bin/python", "/srv/run/code/launch_node/rdzv_store.py",
                                     "--host", "10.0.0.1", "--port", "29400"]


def test_local_gpu_split_sets_cuda_visible_devices():
    from launcher.backends.local.backend import LocalBackend
    from launcher.job.request import RunRequest

    recipe = recipe_from_mapping({**RECIPE, "ddp": {"comm_hook": "none"}}, "exp.yml")
    backend = LocalBackend(gpus_total=8, cpus_total=16, port=41000, cwd="/srv")
    plan = backend.plan(RunRequest(recipe, "run-7", 2), backend.nodes(2))
    assert [c.env["CUDA_VISIBLE_DEVICES"] for c in plan.nodes] == ["0,1,2,3", "4,5,6,7"]
    assert [c.env["OMP_NUM_THREADS"] for c in plan.nodes] == ["2", "2"]
    assert plan.nproc_per_node == 4
    assert plan.rdzv_endpoint == "127.0.0.1:41000"
    assert all(c.env["GLOO_SOCKET_IFNAME"] == "lo" for c in plan.nodes)
    assert plan.nodes[1].argv[plan.nodes[1].argv.index("--rdzv-conf") + 1].startswith("is_host=0")


def test_ipv6_head_is_bracketed():
    recipe = recipe_from_mapping(RECIPE, "exp.yml")
    nodes = [Node(name="a", address="fd00::1", private_address="fd00::1", gpus=0),
             Node(name="b", address="fd00::2", private_address="fd00::2", gpus=0)]
    plan = plan_run(recipe, nodes, "r", placements(nodes))
    assert plan.rdzv_endpoint == "[fd00::1]:29400"


def test_mixed_gpu_counts_with_auto_is_refused():
    from launcher.core.errors import RecipeError

    recipe = recipe_from_mapping(RECIPE, "exp.yml")
    nodes = cluster(2, 8)
    nodes[1] = Node(name="gpu1", address="x", private_address="10.0.0.2", gpus=4)
    with pytest.raises(RecipeError, match="nproc_per_node"):
        plan_run(recipe, nodes, "r", placements(nodes))


def test_shell_line_round_trips_to_the_same_argv():
    recipe = recipe_from_mapping(RECIPE, "exp.yml")
    nodes = cluster(2, 8)
    command = plan_run(recipe, nodes, "run-7", placements(nodes)).nodes[1]
    words = shlex.split(command.shell_line())
    assert words[0] == "env"
    n_env = len(command.env)
    assert words[1:1 + n_env] == [f"{k}={v}" for k, v in command.env.items()]
    assert words[1 + n_env:] == list(command.argv)


def test_dry_run_json_shape_and_nothing_created(run_launch, repo_root, tmp_path):
    proc = run_launch("run", "--local", "--nodes", "2",
                      str(repo_root / "launcher/recipes/vit-tiny-local.yml"),
                      "--dry-run", "--json", "--run-id", "dry-1", check=True)
    plan = json.loads(proc.stdout)
    assert plan["run_id"] == "dry-1"
    assert plan["rendezvous"]["backend"] == "c10d"
    assert plan["rendezvous"]["id"] == "dry-1"
    assert plan["rendezvous"]["endpoint"].startswith("127.0.0.1:")
    assert [n["name"] for n in plan["nodes"]] == ["node0", "node1"]
    for node in plan["nodes"]:
        assert set(node) >= {"name", "address", "argv", "env"}
        assert node["argv"][1:3] == ["-m", "torch.distributed.run"]
    # No run folder, no file of any kind: the tmp cwd holds only what the fixture made.
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    text = run_launch("run", "--local", str(repo_root / "launcher/recipes/vit-tiny-local.yml"),
                      "--dry-run", "--run-id", "dry-2", check=True).stdout
    assert "node node0 (127.0.0.1, head, rendezvous store here" in text
    assert "rendezvous store on node0" in text
    assert "is_host=0" in text and "OMP_NUM_THREADS=1" in text
    assert not (tmp_path / "runs").exists()


def test_without_inventory_the_run_stays_on_this_machine_and_says_so(run_launch, tmp_path):
    """`launch run --nodes 2 RECIPE`, as the README tells people to type it: no "say where to
    run" error; the plan is 2 local nodes and one line on stderr says so (stdout stays JSON).
    By its bundled name, from a folder that holds no recipe."""
    proc = run_launch("run", "--nodes", "2", "vit-tiny-local", "--dry-run", "--json",
                      check=True)
    plan = json.loads(proc.stdout)
    assert [n["name"] for n in plan["nodes"]] == ["node0", "node1"]
    assert plan["rendezvous"]["endpoint"].startswith("127.0.0.1:")
    assert "no inventory given: 2 nodes on this machine" in proc.stderr
    quiet = run_launch("run", "--local", "--nodes", "2", "vit-tiny-local", "--dry-run",
                       check=True)
    assert "no inventory given" not in quiet.stderr


def shipped_paths(value, code_dir: str) -> set[str]:
    """Every string in a plan's JSON that points into the shipped code, relative to it."""
    if isinstance(value, dict):
        return set().union(*(shipped_paths(v, code_dir) for v in value.values()))
    if isinstance(value, list):
        return set().union(*(shipped_paths(v, code_dir) for v in value))
    return {value[len(code_dir) + 1:]} if isinstance(value, str) and \
        value.startswith(code_dir + "/") else set()


def test_every_file_a_plan_starts_from_the_shipped_code_is_shipped():
    """The plan names launch's node code by path strings: one naming a file no backend ships
    would fail only on a node. The trainer with its store, probes, mirror and spot watcher; a
    user's script and command; the bandwidth sweep and the collective gate."""
    from launcher.check.collective_gate import gate_job
    from launcher.core.node_code import code_files, code_root
    from launcher.job.mirror import with_mirror
    from launcher.job.spec import workload
    from launcher.job.spot import with_spot_watch
    from launcher.nccl.sweep import bench_args

    shipped = set(code_files(code_root()))
    nodes = [Node(name=f"n{i}", address=f"10.0.0.{i}", private_address=f"10.0.0.{i}", gpus=0,
                  extra={"launch_market": "spot"}) for i in range(2)]
    places = {n.name: Placement(python="/py", code_dir="/srv/code", run_dir=f"/srv/{n.name}",
                                workdir="/srv/w", checkpoint_dir="/srv/ckpt") for n in nodes}
    trainer = recipe_from_mapping({"name": "t", "train": {"steps": 10},
                                   "checkpoint": {"every_steps": 5, "mirror": "/shared/ckpt"}},
                                  "t.yml")
    plans = [with_spot_watch(with_mirror(plan_run(trainer, nodes, "r", places), trainer, places,
                                         "u1"), nodes, places),
             plan_run(trainer, nodes, "r", places, job=workload(
                 "launch_bench/bench.py", *bench_args("all_reduce", [8], "float", 1, 1))),
             plan_run(trainer, nodes, "r", places, job=gate_job(1 << 20, 0.02))]
    for job in ({"script": "a.py"}, {"command": ["deepspeed", "t.py"]}):
        recipe = recipe_from_mapping({"name": "j", "workdir": ".", "job": job,
                                      "checkpoint": {"mirror": "/shared/ckpt"}}, "/p/j.yml", "/p")
        plans.append(with_mirror(plan_run(recipe, nodes, "r", places), recipe, places, "u2"))
    named = set().union(*(shipped_paths(p.to_json(), "/srv/code") for p in plans))
    assert {"launch_node/worker.py", "launch_node/rdzv_store.py", "launch_node/node_probe.py",
            "launch_node/mirror.py", "launch_node/spot.py", "train/main.py",
            "launch_bench/bench.py"} <= named
    assert sorted(named - shipped) == []
