"""A user's own training project, as a newcomer brings it to launch: written fresh for each test
(its .gitignore'd files must exist locally and must not reach the nodes).

    main.py            the script: DDP on gloo over a tiny model, LAUNCH_STEP lines, checkpoints
                       in LAUNCH_CHECKPOINT_DIR, and a --mode for each misbehaviour tested
    train/             the user's own package named `train`, like launch's trainer
    launch_node/       and one named like launch's node runtime (launch_node/worker.py
                       starts every rank)
    data/labels.txt    a data file the script reads, relative to its folder
    .gitignore         outputs/ and *.secret: present here, never shipped
    .launchignore      scratch.txt: adds to .gitignore
    setup: writes setup-ran.txt, which main.py checks for

main.py prints one `RESULT {json}` line per rank: what it saw (its argv, the LAUNCH_* variables
and the few others the environment tests give, where `train` was imported from, the data,
which ignored files it can see, what setup found).
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

MAIN = r'''
import gc, json, os, signal, socket, subprocess, sys, time

mode = sys.argv[sys.argv.index("--mode") + 1] if "--mode" in sys.argv else "ok"
# What the tests give with --env, what launch's own environment holds without it, a login's.
PASSED = ("PYTHONPATH", "JOB_TOKEN", "FROM_SHELL", "NOT_PASSED", "HOME", "PATH")
steps = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else 6
pause = float(sys.argv[sys.argv.index("--pause") + 1]) if "--pause" in sys.argv else 0.0
env = {k: v for k, v in os.environ.items()
       if (k.startswith("LAUNCH_") or k in PASSED) and k != "LAUNCH_RUN_STAMP"}
attempt = int(os.environ["LAUNCH_ATTEMPT"])

if mode == "flood":
    for i in range(int(sys.argv[sys.argv.index("--lines") + 1])):
        sys.stdout.write(f"flood {i:08d} {'x' * 80}\n")
    sys.stdout.flush()
    print("flood done", flush=True)
    sys.exit(0)
if mode == "shout":
    # 30 lines on stdout, then an assert: the traceback goes to stderr, and torchrun tails a
    # rank's stdout and stderr files with a thread each (the failure message once showed the
    # 30 lines and not the AssertionError).
    for i in range(30):
        print(f"shout {i:02d} of attempt {os.environ['LAUNCH_ATTEMPT']}")
    assert i == -1, f"the rank gave up after shouting, attempt {os.environ['LAUNCH_ATTEMPT']}"
if mode == "binary":
    sys.stdout.buffer.write(b"bytes \xff\xfe not utf-8 \xc3\x28 end\n")
    sys.stdout.flush()
    print("binary done", flush=True)
    sys.exit(0)

# Imported after the modes that only print (torch costs a second or two of CPU to import).
import torch
import torch.distributed as dist

from train.model import TinyModel, PACKAGE
from launch_node import PACKAGE as NODE_PACKAGE

if mode == "quit-before-init-once" and os.environ["RANK"] == "0":
    # Rank 0 gone before the process group forms, once: its peer is still waiting in
    # init_process_group, healthy, and its agent restarts it for the new round without
    # counting a restart of its own (torch's TORCHELASTIC_RESTART_COUNT stays 0 there).
    marker = os.path.join(os.environ["LAUNCH_CHECKPOINT_DIR"], "quit-before-init")
    if not os.path.exists(marker):
        open(marker, "w").close()
        sys.exit("rank 0 quits before init_process_group, once")
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
# As the DDP tutorial's multinode.py: a snapshot in the working folder, resumed from if there.
snapshot = open("snapshot.pt").read() if os.path.exists("snapshot.pt") else None
if snapshot is None and os.environ["LOCAL_RANK"] == "0":
    with open("snapshot.pt", "w") as f:
        f.write(f"{os.environ['LAUNCH_RUN_ID']} {os.environ['LAUNCH_NODE']}")
print("RESULT " + json.dumps({
    "snapshot": snapshot,
    "rank": rank, "world": world, "argv": sys.argv[1:], "env": env, "cwd": os.getcwd(),
    "package": PACKAGE, "package_file": sys.modules["train.model"].__file__,
    "node_package": NODE_PACKAGE,
    "data": open("data/labels.txt").read().split(),
    "sees": sorted(p for p in ("outputs/model.bin", "token.secret", "scratch.txt",
                               "setup-ran.txt") if os.path.exists(p)),
    "setup": open("setup-ran.txt").read().strip() if os.path.exists("setup-ran.txt") else None,
}), flush=True)

if mode == "term-ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if mode == "fork" and os.environ["LOCAL_RANK"] == "0":
    # A child in a session of its own, out of reach of its parents' process groups.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                             start_new_session=True)
    print(f"forked child {child.pid}", flush=True)

torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(TinyModel())
opt = torch.optim.SGD(model.parameters(), lr=0.1)
ckpt_dir = os.environ["LAUNCH_CHECKPOINT_DIR"]
ckpt = os.path.join(ckpt_dir, "state.pt")
start = 0
if os.path.exists(ckpt):
    state = torch.load(ckpt)
    model.module.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    start = state["step"]
    print(f"resumed from step {start} in attempt {attempt}", flush=True)

x = torch.linspace(-1, 1, 64).reshape(-1, 1)
y = 3 * x + 1
for step in range(start, steps):
    if mode == "raise" and rank == 1 and step == 2:
        try:
            open("token.secret")    # .gitignore'd: not shipped
        except FileNotFoundError as err:
            raise ValueError("user code failed on purpose at step 2") from err
    if mode == "crash-once" and rank == 1 and step == 3 and attempt == 0:
        for i in range(40):   # much said before the error: the error must still be shown
            print(f"rank 1 is about to crash: line {i}")
        assert attempt != 0, "rank 1 crashes once, at step 3"
    if mode == "hang" and rank == 1 and step == 2:
        def stuck_in_user_code():
            while True:
                time.sleep(0.2)
        stuck_in_user_code()
    time.sleep(pause)    # a longer step: a run that lasts while a test acts on it
    started = time.perf_counter()
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    if rank == 0:   # launch made LAUNCH_CHECKPOINT_DIR before the job started
        torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(),
                    "step": step + 1}, ckpt + ".tmp")
        os.replace(ckpt + ".tmp", ckpt)
    dist.barrier()
    print(f"LAUNCH_STEP step={step + 1} loss={loss.item():.6f} "
          f"busy_s={time.perf_counter() - started:.6f}", flush=True)
if mode in ("term-ignore", "fork"):
    time.sleep(600)    # until launch stops it
# DDP's reducer holds the process group: dropped first, or gloo's threads are torn down during
# interpreter finalization, where gloo aborts a rank now and then ("terminate called without
# an active exception"), as train/main.py found.
del model, opt
gc.collect()
dist.barrier()
dist.destroy_process_group()
print(f"rank {rank} done", flush=True)
'''

MODEL = '''
import torch

PACKAGE = "the user's own train package"


class TinyModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(1, 1)

    def forward(self, x):
        return self.linear(x)
'''

# Which python and pip setup finds first: the node's interpreter's (docs/jobs.md).
SETUP = ('echo "setup on $LAUNCH_NODE python=$(command -v python) pip=$(command -v pip)" '
         '| tee setup-ran.txt')


def write_project(root: Path) -> Path:
    """The project's folder, with its ignored files present."""
    files = {
        "main.py": MAIN,
        "train/__init__.py": "",
        "train/model.py": MODEL,
        "launch_node/__init__.py": 'PACKAGE = "the user\'s own launch_node package"\n',
        "data/labels.txt": "cat dog bird\n",
        ".gitignore": "outputs/\n*.secret\n",
        ".launchignore": "scratch.txt\n",
        "outputs/model.bin": "not for the nodes\n",
        "token.secret": "hunter2\n",
        "scratch.txt": "local notes\n",
    }
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def results(output: str) -> dict[int, dict]:
    """Each rank's RESULT line, by rank."""
    out = {}
    for line in output.splitlines():
        _, sep, payload = line.partition("RESULT ")
        if sep and payload.startswith("{"):
            data = json.loads(payload)
            out[data["rank"]] = data
    return out


# Arguments that must arrive verbatim: a shell would split, expand or run them.
HOSTILE_ARGS = ["--label", "two words", "a;b", "$HOME", "`touch pwned`", "$(touch pwned2)",
                "'quoted'", "--steps", "4"]


# A job that brings its own launcher: a torchrun line of its own, from the LAUNCH_* variables
# (static rendezvous on the head, node rank given).
OWN_TORCHRUN = ["bash", "-c",
                'exec "$LAUNCH_PYTHON" -m torch.distributed.run --nnodes "$LAUNCH_NUM_NODES" '
                '--nproc-per-node 1 --node-rank "$LAUNCH_NODE_RANK" --master-addr '
                '"$LAUNCH_HEAD_ADDR" --master-port "$LAUNCH_RDZV_PORT" main.py "$@"', "cmd"]


def command_recipe(project: Path, name: str, args: list[str], **more) -> Path:
    """A recipe whose job is OWN_TORCHRUN on 2 nodes, with main.py's `args`."""
    path = project / f"{name}.yml"
    path.write_text(yaml.safe_dump({"name": name, "nodes": 2, "workdir": ".",
                                    "job": {"command": OWN_TORCHRUN, "args": args}, **more}))
    return path
