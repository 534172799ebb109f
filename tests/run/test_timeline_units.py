"""The run timeline's partition (launcher/runs/timeline.py) on a clock the test moves: the
phases add up to the wall time, the job's part is split where its steps say, and goodput
counts only the time in steps that were kept."""

from launcher.runs.timeline import FOLLOWING, JOB, Timeline, describe, handed_over


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def phases(doc):
    return {p["name"]: p["s"] for p in doc["phases"]}


def run_with_steps(clock, timeline, steps, every=1.0):
    for step in steps:
        clock.advance(every)
        timeline.line("n0", "0", f"LAUNCH_STEP step={step} loss=0.5")


def test_phases_add_up_to_the_wall_time_and_the_job_is_split_at_its_steps():
    clock = Clock()
    timeline = Timeline(start=99.0, clock=clock)   # the process began a second before
    timeline.begin("preflight")
    clock.advance(2.0)
    timeline.begin("preparation")
    clock.advance(3.0)
    timeline.begin(JOB)
    clock.advance(4.0)                              # rendezvous, the first step's own time
    run_with_steps(clock, timeline, range(1, 11))   # 10 steps, one a second: 9 s of training
    clock.advance(0.5)
    timeline.begin("collection")
    clock.advance(0.25)
    doc = timeline.to_json()
    got = phases(doc)
    assert got == {"start-up": 1.0, "preflight": 2.0, "preparation": 3.0,
                   "to first step": 5.0, "training": 9.0, "stop": 0.5, "collection": 0.25}
    assert doc["wall_s"] == 20.75
    assert abs(sum(got.values()) - doc["wall_s"]) < 1e-6
    assert doc["goodput"] == round(9.0 / 20.75, 4)
    assert doc["first_step_s"] == 11.0
    assert doc["largest_losses"][0] == {"kind": "phase", "what": "to first step", "s": 5.0}
    assert doc["nodes"]["n0"]["first_step_s"] == 11.0


def test_a_restart_and_its_recomputed_steps_are_lost_and_named():
    clock = Clock()
    timeline = Timeline(clock=clock)
    job_start = timeline.begin(JOB)
    run_with_steps(clock, timeline, range(1, 11))    # steps 1..10 at t+1..t+10
    clock.advance(0.5)
    detected = clock() - job_start                     # node n1 fails at t+10.5
    clock.advance(6.5)
    run_with_steps(clock, timeline, range(6, 16))    # resumed at step 6 (t+18): 5 redone
    timeline.begin("collection")
    incident = {"node": "n1", "reason": "worker local_rank 0 (pid 7) was killed by SIGKILL",
                "at_time_s": detected, "reached_step": 10, "next_step": 6}
    doc = timeline.to_json(incidents=[incident])
    losses = {loss["kind"]: loss for loss in doc["training_losses"]}
    assert losses["restart"]["s"] == 7.5             # detection to the next step reported
    assert "node n1" in losses["restart"]["what"]
    assert losses["recomputed"]["s"] == 5.0          # 5 steps at a second each
    training = phases(doc)["training"]
    assert training == 26.0
    assert doc["kept_steps_s"] == 26.0 - 12.5
    assert doc["goodput"] < 1
    assert doc["largest_losses"][0]["kind"] == "restart"
    assert "restart after node n1 failed" in describe(doc)


def test_the_trainer_s_lines_are_its_steps_and_a_hang_wait_is_a_loss():
    clock = Clock()
    timeline = Timeline(clock=clock)
    job_start = timeline.begin(JOB)
    clock.advance(2.0)
    timeline.line("n0", "0", "step 1: first step")
    for step in (10, 20):
        clock.advance(9.0)
        timeline.line("n0", "0", f"step {step}/20 epoch 1/1 loss 1.2345 lr 1.00e-01 "
                                 "step_time 1.000s 64.0 img/s, waiting on communication 3%")
    hang = {"detected_at_s": clock() - job_start - 1.0, "idle_s": 4.0}
    doc = timeline.to_json(hangs=[hang], checkpoint_blocking_s=0.5)
    assert phases(doc)["to first step"] == 2.0
    assert phases(doc)["training"] == 18.0
    kinds = {loss["kind"]: loss["s"] for loss in doc["training_losses"]}
    assert kinds == {"hang": 4.0, "checkpoint": 0.5}
    assert doc["kept_steps_s"] == 13.5


def test_a_job_that_reports_no_step_has_no_goodput():
    clock = Clock()
    timeline = Timeline(clock=clock)
    timeline.begin(JOB)
    clock.advance(3.0)
    timeline.line("n0", "0", "hello from the job")
    doc = timeline.to_json()
    assert doc["goodput"] is None
    assert phases(doc) == {"start-up": 0.0, "job, no steps reported": 3.0}
    assert "no goodput" in describe(doc)


def test_attempts_in_one_process_add_their_phases():
    clock = Clock()
    timeline = Timeline(clock=clock)
    for _ in range(2):
        timeline.begin("preflight")
        clock.advance(1.0)
        timeline.begin(JOB)
        run_with_steps(clock, timeline, range(1, 4))
        timeline.begin("machine recovery")
        clock.advance(5.0)
    doc = timeline.to_json()
    got = phases(doc)
    assert got["preflight"] == 2.0 and got["machine recovery"] == 10.0
    assert got["training"] == 4.0 and got["to first step"] == 2.0
    assert abs(sum(got.values()) - doc["wall_s"]) < 1e-6


def test_the_page_s_bar_escapes_what_the_run_folder_says():
    from launcher.report.html import timeline_bar

    doc = {"wall_s": 10.0, "goodput": 0.5, "kept_steps_s": 5.0,
           "phases": [{"name": "<script>x</script>", "s": 2.0}, {"name": "training", "s": 8.0}],
           "largest_losses": [{"kind": "restart", "what": "restart after <b>", "s": 3.0}]}
    bar = timeline_bar(doc)
    assert "<script>" not in bar and "&lt;script&gt;" in bar and "&lt;b&gt;" in bar
    # training drawn as its kept part and its lost part
    assert "training: 5.00 s" in bar and "lost in training: 3.00 s" in bar
    assert timeline_bar({"wall_s": 0.0}) == "" and timeline_bar(None) == ""


def test_a_handed_over_run_holds_this_machine_s_wall_time_with_the_controller_s_parts():
    """A Slurm run followed by `launch run`: the controller's phases (its own host's clock,
    durations only) sit inside this process's wall time, after its own start-up and
    hand-over and the wait for the job; its moments move by what came before."""
    controller_clock = Clock()
    controller_clock.now = 5000.0                   # another host: another clock
    inner = Timeline(start=4999.0, clock=controller_clock)
    inner.begin(JOB)
    controller_clock.advance(2.0)
    run_with_steps(controller_clock, inner, range(1, 5))
    inner.begin("report")
    controller_clock.advance(0.5)
    theirs = inner.to_json()                         # wall 7.5: 1 + 2 + 3 (+1 first) + 0.5

    clock = Clock()
    own = Timeline(start=99.0, clock=clock)
    own.begin("hand-over")
    clock.advance(0.5)
    own.begin(FOLLOWING)
    clock.advance(10.0)                              # 7.5 s the controller, 2.5 queued and seen
    doc = handed_over(own, theirs)
    got = [(p["name"], p["s"]) for p in doc["phases"]]
    assert got[:4] == [("start-up", 1.0), ("hand-over", 0.5), ("queue and follow", 2.5),
                       ("controller start-up", 1.0)]
    assert got[-1] == ("controller report", 0.5)
    assert doc["wall_s"] == 11.5 and doc["controller_wall_s"] == 7.5
    # The report written again here once the run ended: this process's last phase, after the
    # controller's; the wait is what it was, the wall time grows by the report's time.
    own.begin("report")
    clock.advance(0.25)
    again = handed_over(own, theirs)
    assert [(p["name"], p["s"]) for p in again["phases"]] == [*got, ("report", 0.25)]
    assert again["wall_s"] == 11.75 and again["controller_at_s"] == doc["controller_at_s"]
    assert abs(sum(s for _, s in got) - doc["wall_s"]) < 1e-6
    assert doc["goodput"] == round(theirs["kept_steps_s"] / 11.5, 4)
    assert doc["first_step_s"] == theirs["first_step_s"] + 4.0
    assert doc["nodes"]["n0"]["first_step_s"] == theirs["nodes"]["n0"]["first_step_s"] + 4.0
