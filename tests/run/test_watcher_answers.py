"""The node watcher's answers (launcher/execute/watcher_answers.py), as both the SSH channel
and the Slurm step deliver them: in pieces, several at once, too many, or not at all; and the
one watcher per node both keep for the run."""

from __future__ import annotations

import pytest

from launcher.core.errors import LauncherError
from launcher.execute.watcher_answers import MAX_ANSWER, KeptWatcher, WatcherAnswers, last_line


def chunks(*parts: bytes):
    it = iter(parts)
    return lambda: next(it, b"")


def test_an_answer_in_pieces_and_two_in_one_piece_come_out_one_by_one():
    answers = WatcherAnswers("host1")
    recv = chunks(b'{"a": ', b'1}\n{"b"', b': 2}\n{"c": 3}\n')
    said = lambda: "unused"   # noqa: E731
    assert answers.next(recv, said) == {"a": 1}
    assert answers.next(recv, said) == {"b": 2}
    assert answers.next(recv, said) == {"c": 3}   # from what was kept, nothing read


def test_a_watcher_that_ends_is_named_with_what_it_said():
    with pytest.raises(LauncherError, match=r"watcher on node2 \(job 7\) ended: no torch"):
        WatcherAnswers("node2 (job 7)").next(chunks(b'{"half'), lambda: "no torch")


def test_an_answer_past_the_bound_or_not_json_is_refused():
    big = WatcherAnswers("host1")
    with pytest.raises(LauncherError, match="answered more than 4 MB"):
        big.next(lambda: b"x" * (1 << 20), lambda: "")
    with pytest.raises(LauncherError, match="not JSON: b'Traceback"):
        WatcherAnswers("host1").next(chunks(b"Traceback (most recent call last)\n"), str)


def test_the_last_line_said_and_the_exit_status():
    assert last_line(b"warming up\nImportError: no torch\n", 1) == "ImportError: no torch (exit 1)"
    assert last_line(b"", None) == "no output"
    assert last_line(b"x" * (2 * MAX_ANSWER) + b"\nend", None) == "end"


class _Fake:
    """A backend's watcher as KeptWatcher sees it: alive until told, answering or failing."""

    def __init__(self, made: list):
        made.append(self)
        self.up, self.closed, self.fail = True, False, False

    def alive(self) -> bool:
        return self.up

    def ask(self, what: str, timeout: float):
        if self.fail:
            raise LauncherError("no answer")
        return {"asked": what, "by": id(self)}

    def close(self) -> None:
        self.closed = True


def test_one_watcher_is_kept_replaced_when_it_died_or_failed_and_closed_at_the_end():
    made: list[_Fake] = []
    kept = KeptWatcher(lambda: _Fake(made))
    assert made == []                                  # nothing started before the first look
    first = kept.ask("heartbeats")
    assert kept.ask("activity")["by"] == first["by"] and len(made) == 1
    made[0].up = False                                 # it died: replaced at the next look
    kept.ask("activity")
    assert len(made) == 2 and made[0].closed
    made[1].fail = True                                # a failed look closes it
    with pytest.raises(LauncherError, match="no answer"):
        kept.ask("activity")
    assert made[1].closed
    kept.ask("activity")
    assert len(made) == 3
    kept.close()
    assert made[2].closed


def test_a_node_is_quiet_only_while_a_look_waits_unanswered():
    """What launcher/execute/recovery.py asks the fleet about: a look the node has not
    answered, not the time since its last answer (a paused hang watch, a slow round of looks
    over hundreds of nodes, asks nothing and makes no node quiet)."""
    import threading

    now = [0.0]
    asked, release = threading.Event(), threading.Event()

    class Hanging(_Fake):
        hang = False

        def ask(self, what, timeout):
            if self.hang:
                asked.set()
                release.wait(10)
            return super().ask(what, timeout)

    made: list = []
    kept = KeptWatcher(lambda: Hanging(made), clock=lambda: now[0])
    kept.ask("heartbeats")
    assert kept.quiet_s() is None            # answered, nothing waits
    now[0] += 600.0                          # the watch paused for ten minutes: not silence
    assert kept.quiet_s() is None
    made[0].hang = True                      # the machine vanished under the next look
    look = threading.Thread(target=kept.ask, args=("heartbeats",))
    look.start()
    assert asked.wait(10)
    now[0] += 7.0
    assert kept.quiet_s() == 7.0             # this look's wait, not the ten minutes before
    release.set()
    look.join(10)
    assert kept.quiet_s() is None            # answered late (a loaded machine): quiet no more
