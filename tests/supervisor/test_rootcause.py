"""The choice of the root cause (:mod:`unirank.supervisor.rootcause`) over plain facts: the rank
that failed first on its own is blamed, whatever order the exits were seen in; lost-peer
records come after every own failure; a worker stopped by the teardown is never blamed.
(tests/supervisor/test_root_cause.py checks the same with real gloo groups.)"""

from __future__ import annotations

import math
import signal

from unirank.errorfile import RecordedFailure
from unirank.exitcodes import REQUEUE as REQUEUE_EXIT_CODE
from unirank.supervisor.rootcause import Ending, failure_key, root_cause

TERM, KILL = int(signal.SIGTERM), int(signal.SIGKILL)


def _record(when: float, *, lost_peer: bool = False, code: int = 1) -> RecordedFailure:
    return RecordedFailure(time=when, message="boom", exit_code=code, lost_peer=lost_peer)


def test_no_failure_no_root_cause() -> None:
    assert root_cause([Ending(0, 0), Ending(1, 0)], None) is None


def test_the_earlier_record_wins_over_the_order_the_exits_were_seen_in() -> None:
    """Rank 0 was seen to fail first (index 0 is the first failure), but rank 1 recorded its
    failure earlier."""
    endings = [Ending(0, 1, ended_at=20.0, record=_record(15.0)),
               Ending(1, 3, ended_at=21.0, record=_record(10.0, code=3))]
    assert root_cause(endings, 0) == 1


def test_an_own_failure_wins_over_an_earlier_lost_peer_record() -> None:
    endings = [Ending(0, 1, ended_at=11.0, record=_record(10.0, lost_peer=True)),
               Ending(1, 1, ended_at=13.0, record=_record(12.0))]
    assert root_cause(endings, 0) == 1


def test_lost_peers_alone_blame_the_earliest() -> None:
    endings = [Ending(0, 1, record=_record(12.0, lost_peer=True)),
               Ending(1, 1, record=_record(11.0, lost_peer=True))]
    assert root_cause(endings, 0) == 1


def test_a_worker_ended_by_the_teardown_s_signal_is_not_blamed() -> None:
    """Rank 0 was killed by the SIGTERM the teardown sent it; rank 1, without a record, ended
    later on its own (a segfault seen after the teardown began)."""
    endings = [Ending(0, -TERM, ended_at=5.0, stopped_at=4.0, stop_signals=frozenset({TERM})),
               Ending(1, -int(signal.SIGSEGV), ended_at=6.0, stopped_at=4.0,
                      stop_signals=frozenset({TERM}))]
    assert failure_key(endings[0]) is None
    assert root_cause(endings, 0) == 1


def test_a_record_written_after_the_teardown_s_signal_is_not_blamed() -> None:
    endings = [Ending(0, 1, stopped_at=4.0, record=_record(4.5)),
               Ending(1, 2, ended_at=3.0)]
    assert failure_key(endings[0]) is None
    assert root_cause(endings, 1) == 1


def test_a_record_written_before_the_teardown_s_signal_is_blamed() -> None:
    endings = [Ending(0, 1, stopped_at=4.0, ended_at=4.2, record=_record(3.5)),
               Ending(1, 2, ended_at=3.9)]
    assert root_cause(endings, 1) == 0


def test_without_a_record_the_time_the_end_was_seen_counts() -> None:
    endings = [Ending(0, 2, ended_at=9.0), Ending(1, 3, ended_at=8.0)]
    assert root_cause(endings, 0) == 1


def test_a_worker_whose_end_time_is_unknown_comes_last() -> None:
    assert failure_key(Ending(4, 2)) == (False, math.inf, 4)
    assert root_cause([Ending(0, 2), Ending(1, 3, ended_at=8.0)], 0) == 1


def test_ties_go_to_the_lower_rank() -> None:
    endings = [Ending(1, 1, record=_record(5.0)), Ending(0, 1, record=_record(5.0))]
    assert root_cause(endings, 0) == 1


def test_success_and_requeue_are_never_blamed() -> None:
    assert failure_key(Ending(0, 0)) is None
    assert failure_key(Ending(0, REQUEUE_EXIT_CODE, record=_record(1.0))) is None
    assert failure_key(Ending(0, None)) is None


def test_when_everyone_was_stopped_the_first_seen_to_fail_is_blamed() -> None:
    endings = [Ending(0, -KILL, stop_signals=frozenset({TERM, KILL})),
               Ending(1, -TERM, stop_signals=frozenset({TERM}))]
    assert root_cause(endings, 1) == 1
