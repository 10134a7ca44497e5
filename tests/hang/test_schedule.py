"""When the detector reports (pure, milliseconds): the first report after the delay, again at
each doubling, the last at ``--hang-timeout``; only a hang's first report is full."""

from __future__ import annotations

from unirank.hang.detect import Hang
from unirank.hang.render import changed_ranks
from unirank.hang.schedule import Decision, Schedule, decide
from unirank.hang.standby import takeover_line


def hang(waited: float, seq: int = 4) -> Hang:
    return Hang("0", seq, (), (), (), waited, {})


def run(waits: list[float], limit: float | None = None, seq: int = 4) -> list[Decision]:
    schedule, seen = Schedule(), []
    for waited in waits:
        schedule, decision = decide(schedule, [hang(waited, seq)], 5.0, limit)
        seen.append(decision)
    return seen


def test_the_first_report_is_full_and_the_next_ones_come_at_each_doubling() -> None:
    decisions = run([4.0, 5.0, 6.0, 9.9, 10.0, 19.0, 20.0])
    assert [(d.report, d.number, d.full) for d in decisions] == [
        (False, 0, False), (True, 1, True), (False, 0, False), (False, 0, False),
        (True, 2, False), (False, 0, False), (True, 3, False)]


def test_the_timeout_reports_and_ends_at_once() -> None:
    decisions = run([5.0, 7.0, 8.0], limit=8.0)
    assert [(d.report, d.ending) for d in decisions] == [(True, False), (False, False),
                                                         (True, True)]


def test_another_hang_starts_over_and_no_hang_reports_nothing() -> None:
    schedule, first = decide(Schedule(), [hang(6.0)], 5.0, None)
    schedule, again = decide(schedule, [hang(6.0, seq=9)], 5.0, None)
    assert (first.number, again.number, again.full) == (1, 1, True)
    schedule, none = decide(schedule, [], 5.0, None)
    assert none == Decision() and schedule.key == ()


def test_changed_ranks_compares_every_thread() -> None:
    waiting = [{"name": "MainThread", "frames": [["t.py", 5, "f", ""]]}]
    moved = [{"name": "MainThread", "frames": [["t.py", 6, "f", ""]]}]
    assert changed_ranks({0: waiting, 1: waiting}, {0: waiting, 1: moved, 2: waiting}) == [1, 2]


def test_a_standby_says_why_it_reports() -> None:
    assert takeover_line(2, 0.5) == (
        "unirank: ranks 0-1 have sent no progress record for 8 s (frozen, or its interpreter "
        "is held): rank 2 looks for hangs instead\n")
