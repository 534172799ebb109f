"""The node watcher's answers (launcher/execute/watcher_answers.py), as both the SSH channel
and the Slurm step deliver them: in pieces, several at once, too many, or not at all."""

from __future__ import annotations

import pytest

from launcher.core.errors import LauncherError
from launcher.execute.watcher_answers import MAX_ANSWER, WatcherAnswers, last_line


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
