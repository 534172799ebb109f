"""comm_hook auto and bucket_cap_mb auto decide on measurements repeated until they are clear
(train/autocomm.py), on numbers these tests give; the trial's fork puts the run back exactly
(train/trial.py); PowerSGD switched off hands its residual to the next plain all-reduce
(train/ddp.py). DDP, PowerSGD and the process group are real (a gloo group of one rank)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from train.autocomm import (DDP_DEFAULT_BUCKET_MB, AutoCompression, LinkProbe, binomial_tail,
                            choose_bucket_cap_mb, decide_bucket_cap_mb, loss_excess,
                            probe_link, sign_test)
from train.ddp import NEVER, DDPSettings, wrap_ddp
from train.model import build_vit
from train.options import auto_trial_from
from train.stepsplit import StepTimes
from train.trial import trial_round

MB = 1 << 20
CPU = torch.device("cpu")


# ---- the sign test (hand-computed binomial tails) -----------------------------------------

def test_binomial_tail():
    assert binomial_tail(7, 7) == 1 / 128
    assert binomial_tail(10, 9) == 11 / 1024
    assert binomial_tail(11, 10) == 12 / 2048
    assert binomial_tail(5, 0) == 1.0


@pytest.mark.parametrize("values, verdict", [
    ([0.2] * 7, "above"),                    # 1/128 <= 0.01
    ([0.2] * 6, None),                       # 1/64: not yet
    ([0.1] * 7, "below"),
    ([0.2] * 9 + [0.1], None),               # 11/1024 > 0.01
    ([0.2] * 10 + [0.1], "above"),           # 12/2048
    ([0.2, 0.1] * 20, None),                 # as often above as below: never clear
    ([0.15] * 20, None),                     # ties count for neither side
])
def test_sign_test(values, verdict):
    assert sign_test(values, 0.15) == verdict


# ---- bucket_cap_mb: auto -----------------------------------------------------------------

@pytest.mark.parametrize("latency,bandwidth,grad_mb,expected", [
    (50e-6, 2e9, 21.4, 5.35),     # a quarter of the gradients
    (2e-3, 12.5e6, 21.4, 5.35),   # slow link: latency is no concern, still a quarter
    (50e-6, 2e9, 2.0, 1.91),      # small model: 20 x latency x bandwidth = 2 MB = 1.91 MiB
    (1e-6, 1e9, 2.0, 1.0),        # never below 1 MiB
    (1e-3, 10e9, 346.0, 190.73),  # latency-heavy fast link: 200 MB buckets
    (1e-2, 10e9, 4000.0, 256.0),  # never above 256 MiB
])
def test_bucket_choice(latency, bandwidth, grad_mb, expected):
    probe = LinkProbe(latency, bandwidth, 1 << 14, 1 << 22, 0.0, 0.0)
    assert choose_bucket_cap_mb(probe, int(grad_mb * MB)) == pytest.approx(expected, abs=0.01)


@pytest.mark.parametrize("grad_mb,expected", [
    (21.4, 25.0),      # the demo's ViT-Tiny: one bucket of DDP's default size, not 5.35
    (2.0, 25.0),       # a small model: the whole gradient in one
    (346.0, 86.5),     # a large one: a quarter already exceeds it
    (4000.0, 256.0),   # never above 256 MiB
])
def test_buckets_for_powersgd_are_never_smaller_than_ddps_default(grad_mb, expected):
    """comm_hook powersgd or auto: PowerSGD's fixed work per bucket wants few buckets."""
    probe = LinkProbe(50e-6, 2e9, 1 << 14, 1 << 22, 0.0, 0.0)
    assert choose_bucket_cap_mb(probe, int(grad_mb * MB), compressing=True) == \
        pytest.approx(expected, abs=0.01)
    choice = decide_bucket_cap_mb(CPU, int(grad_mb * MB), probe=lambda device: probe,
                                  compressing=True)
    assert (choice.choice, choice.bucket_cap_mb) == ("decided", pytest.approx(expected, abs=0.01))


def _probes(latencies):
    found = iter(latencies)
    return lambda device: LinkProbe(next(found), 700e6, 1 << 14, 1 << 22, 0.0, 0.0)


def test_bucket_size_is_taken_once_three_rounds_agree():
    """20.4 MiB of gradients; 0.1 ms of latency puts the floor under a quarter (5.1 MiB)."""
    choice = decide_bucket_cap_mb(CPU, int(20.4 * MB), probe=_probes([1e-4] * 8))
    assert (choice.choice, choice.bucket_cap_mb, choice.rounds) == \
        ("decided", 5.1, [5.1, 5.1, 5.1])


def test_bucket_size_stays_ddps_default_when_the_rounds_never_agree():
    """Loopback on a busy machine: the latency fit swings from 0.1 to 4 ms between rounds,
    and with it the size (5.1 to 53 MiB)."""
    choice = decide_bucket_cap_mb(CPU, int(20.4 * MB), probe=_probes([1e-4, 4e-3] * 4))
    assert choice.choice == "undecided" and choice.bucket_cap_mb == DDP_DEFAULT_BUCKET_MB
    assert len(choice.rounds) == 8


def test_link_probe_measures_the_real_group(world_of_one):
    probe = probe_link(CPU, iters=3)
    assert probe.large_s >= 0 and probe.small_s >= 0
    assert probe.bandwidth_bytes_per_s > 0 and probe.latency_s >= 0


# ---- comm_hook: auto, 1: the share of plain all-reduce -----------------------------------

def _auto(total=400, warmup=16, start_iter=10, **kw):
    torch.manual_seed(0)
    model = build_vit("vit_tiny", 8, 4, 1, 10, depth=1)
    ddp, state = wrap_ddp(model, DDPSettings(comm_hook="auto", powersgd_rank=4,
                                             bucket_cap_mb=0.25), CPU)
    return AutoCompression(state, total_steps=total, lr_warmup_steps=warmup,
                           start_iter=start_iter, **kw), ddp, state


def _measure(auto, shares, step_s=1.0):
    said = []
    for i, share in enumerate(shares, 1):
        decision = auto.after_step(i, StepTimes(step_s, share * step_s), CPU)
        said += [decision] if decision else []
    return said


def test_communication_clearly_small_keeps_plain_all_reduce(world_of_one):
    auto, _, state = _auto()
    [decision] = _measure(auto, [0.05] * 12)
    # Steps 3 to 10: eight below 15%, agreed on every 4 steps; clear at the eighth.
    assert decision.choice == "none" and decision.decided_at_step == 10
    assert decision.reason == ("communication 5% of the step (mean of 8 plain steps; above 15% "
                               "in 0 of them): nothing to gain")
    assert (decision.share_steps, decision.share_above) == (8, 0)
    assert not auto.uses_powersgd() and state.start_powerSGD_iter == NEVER


def test_communication_clearly_large_starts_the_trial_after_the_warm_up(world_of_one):
    auto, _, _ = _auto()
    assert _measure(auto, [0.4] * 12) == []
    assert auto.phase == "trial" and not auto.uses_powersgd()
    assert auto.trial_from == 16 == auto_trial_from(10, 16)
    assert not auto.trial_due(12, 100) and auto.trial_due(16, 100)
    assert not auto.trial_due(16, 15)   # a round needs 16 steps (in one epoch)


def test_a_share_that_stays_unclear_ends_undecided(world_of_one):
    auto, _, _ = _auto()
    [decision] = _measure(auto, [0.10, 0.20] * 21)
    assert decision.choice == "undecided" and decision.decided_at_step == 42
    assert decision.reason.endswith("not clearly above or below 15%; plain all-reduce kept")
    assert decision.share_steps == 40


def test_the_first_steps_are_not_measured(world_of_one):
    auto, _, _ = _auto()
    _measure(auto, [0.9, 0.9] + [0.05] * 10)
    assert auto.decision.share_steps == 8 and auto.decision.share_above == 0


# ---- comm_hook: auto, 2 and 3: the trial's rounds ----------------------------------------

ROUND = 16


def _round(auto, plain_s, psgd_s, plain_loss=None, psgd_loss=None, done=32):
    plain_loss = plain_loss or [2.0 - 0.01 * i for i in range(ROUND)]
    psgd_loss = psgd_loss or plain_loss
    return auto.take_round([(t, x) for t, x in zip(plain_s, plain_loss)],
                           [(t, x) for t, x in zip(psgd_s, psgd_loss)], done, CPU)


def _trial_auto():
    auto, ddp, state = _auto()
    _measure(auto, [0.6] * 12)
    return auto, state


def test_a_trial_where_powersgd_is_clearly_faster_keeps_it(world_of_one):
    auto, state = _trial_auto()
    decision, keep = _round(auto, [1.0] * ROUND, [0.9] + [0.3] * 15)
    assert keep and decision.choice == "powersgd" and auto.uses_powersgd()
    assert (decision.trial_pairs, decision.trial_faster) == (15, 15)  # the first pair left out
    assert (decision.allreduce_step_s, decision.powersgd_step_s) == (1.0, 0.3)
    assert decision.reason == (
        "communication 60% of the step (mean of 8 plain steps; above 15% in 8 of them); in the "
        "trial PowerSGD steps took 0.300s against 1.000s for plain ones on the same batches "
        "(medians, 70% faster), at least 10% faster in 15 of 15 pairs; loss guard: PowerSGD's "
        "loss +0.0% against plain all-reduce's on the same batches")
    assert decision.loss_excess == 0.0 and state.flush_residual is False


def test_a_trial_where_powersgd_is_not_faster_keeps_plain_all_reduce(world_of_one):
    auto, state = _trial_auto()
    decision, keep = _round(auto, [1.0] * ROUND, [1.05] * ROUND)
    assert not keep and decision.choice == "none" and not auto.uses_powersgd()
    assert "at least 10% faster in 0 of 15 pairs" in decision.reason


def test_the_loss_guard_stops_a_faster_powersgd_whose_loss_strays(world_of_one):
    """Faster in every pair, but over the round's second half its loss is 5% above plain
    all-reduce's on the same batches (PowerSGD at rank 1 on the demo: 14%): plain all-reduce
    is kept."""
    auto, _ = _trial_auto()
    plain = [2.0] * ROUND
    decision, keep = _round(auto, [1.0] * ROUND, [0.3] * ROUND, plain, [2.0] * 8 + [2.1] * 8)
    assert not keep and decision.choice == "none"
    assert decision.loss_excess == 0.05
    assert "the loss guard stopped it" in decision.reason and "5.0% above" in decision.reason


def test_the_loss_guard_lets_a_small_excess_pass(world_of_one):
    """PowerSGD at rank 4 on the demo: 2% above plain all-reduce's loss over the round's
    second half, and 97% held-out accuracy at the end (plain: 96%)."""
    auto, _ = _trial_auto()
    decision, keep = _round(auto, [1.0] * ROUND, [0.3] * ROUND, [2.0] * ROUND,
                            [2.0] * 8 + [2.04] * 8)
    assert keep and decision.choice == "powersgd" and decision.loss_excess == 0.02
    assert "loss guard: PowerSGD's loss +2.0% against plain all-reduce's" in decision.reason


def test_an_unclear_trial_takes_more_rounds_then_ends_undecided(world_of_one):
    auto, _ = _trial_auto()
    mixed = [1.0, 0.5] * 8   # half the pairs faster, half not
    assert _round(auto, [1.0] * ROUND, mixed) == (None, False)
    assert auto.phase == "trial"
    assert _round(auto, [1.0] * ROUND, mixed, done=48) == (None, False)
    decision, keep = _round(auto, [1.0] * ROUND, mixed, done=64)
    assert not keep and decision.choice == "undecided" and decision.decided_at_step == 64
    assert decision.reason.endswith("not clear after 3 round(s), plain all-reduce kept")
    assert decision.trial_pairs == 15 + 16 + 16


def test_loss_excess_reads_the_second_half():
    assert loss_excess([1.0] * 8, [5.0] * 4 + [1.1] * 4) == pytest.approx(0.1)


def test_a_run_ending_before_a_decision_says_where(world_of_one):
    auto, _, _ = _auto()
    _measure(auto, [0.6] * 5)
    outcome = auto.outcome(5)
    assert outcome["choice"] == "undecided" and outcome["last_steps_used"] == "all-reduce"
    assert outcome["reason"] == "run ended at step 5 during the measurement of plain all-reduce"
    auto, _ = _trial_auto()
    assert auto.outcome(14)["reason"] == ("run ended at step 14 during the wait for the PowerSGD "
                                          "trial (from step 17, 16 steps within one epoch)")


# ---- the residual of a switched-off PowerSGD ---------------------------------------------

def test_switching_powersgd_off_adds_its_residual_to_the_next_plain_all_reduce(world_of_one):
    auto, ddp, state = _auto()
    images = torch.randn(16, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    labels = torch.arange(16) % 10
    for _ in range(2):   # DDP rebuilds its buckets first
        ddp.zero_grad()
        F.cross_entropy(ddp(images), labels).backward()
    auto.use(True)
    ddp.zero_grad()
    F.cross_entropy(ddp(images), labels).backward()
    residual = sum(float(t.sum()) for t in state.error_dict.values())
    assert state.error_dict and residual != 0.0
    auto.use(False)
    ddp.zero_grad()
    F.cross_entropy(ddp(images), labels).backward()
    flushed = sum(float(p.grad.sum()) for p in ddp.parameters())
    assert not state.error_dict        # used once, then gone
    ddp.zero_grad()
    F.cross_entropy(ddp(images), labels).backward()
    plain = sum(float(p.grad.sum()) for p in ddp.parameters())
    # One rank: the all-reduce averages over one buffer, so the residual comes in whole.
    assert flushed - plain == pytest.approx(residual, rel=1e-4, abs=1e-5)


# ---- the trial's fork ----------------------------------------------------------------------

def _run():
    """What trial_round needs of a run, with the real DDP, PowerSGD and AdamW."""
    auto, ddp, state = _auto()
    _measure(auto, [0.6] * 12)
    data = [(torch.randn(8, 1, 8, 8, generator=torch.Generator().manual_seed(i)),
             torch.arange(8) % 10) for i in range(40)]
    run = SimpleNamespace(ddp=ddp, hook_state=state, auto=auto, device=CPU, step=16,
                          optimizer=torch.optim.AdamW(ddp.parameters(), lr=1e-3),
                          comm=SimpleNamespace(steps=[]), last_loss=None)

    def train_step(run, batches):
        images, labels = next(batches)
        run.optimizer.zero_grad()
        loss = F.cross_entropy(run.ddp(images), labels)
        loss.backward()
        run.optimizer.step()
        return loss.item()

    def one_step(run, batches):
        loss = train_step(run, batches)
        run.comm.steps.append(StepTimes(1.0, 0.5, 0.0))
        run.step += 1
        return loss

    return run, iter(data), data, one_step, train_step


def _weights(run):
    return {k: v.clone() for k, v in run.ddp.module.state_dict().items()}


def test_a_round_that_keeps_plain_all_reduce_leaves_exactly_the_plain_run(world_of_one,
                                                                           monkeypatch):
    run, batches, data, one_step, train_step = _run()
    monkeypatch.setattr(run.auto, "take_round", lambda *a: (None, False))
    trial_round(run, batches, one_step, train_step)
    after_round = _weights(run)
    assert run.step == 16 + ROUND and not run.auto.uses_powersgd()
    # The same steps without any trial, from the same start, reach the same weights.
    twin, twin_batches, _, twin_step, _ = _run()
    for _ in range(ROUND):
        twin_step(twin, twin_batches)
    for name, value in _weights(twin).items():
        assert torch.equal(after_round[name], value), name
    assert next(batches)[0].equal(data[ROUND][0])   # the round drew its batches once


def test_a_round_that_keeps_powersgd_goes_on_from_its_branch(world_of_one, monkeypatch):
    run, batches, _, one_step, train_step = _run()
    rounds = []
    monkeypatch.setattr(run.auto, "take_round",
                        lambda plain, psgd, done, device: rounds.append((plain, psgd))
                        or (None, True))
    trial_round(run, batches, one_step, train_step)
    [(plain, psgd)] = rounds
    assert run.step == 16 + ROUND and run.auto.uses_powersgd()
    assert psgd[0][1] == pytest.approx(plain[0][1])     # the same start, the same batch
    assert run.last_loss == psgd[-1][1]
    assert psgd[-1][1] != pytest.approx(plain[-1][1])   # compression changed the trajectory
