"""The fault harness's invariants (tests/integration/faults/checks.py), over hand-made logs:
each holds on a good run and names what broke on a bad one."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from faults.checks import (
    Happened,
    Step,
    ending,
    in_flight,
    leftovers,
    parse_steps,
    recoveries,
    recovery_times,
    steps_backwards,
    trained,
    two_worlds,
    worlds,
)


def _world(node: int, pid: int, size: int, steps: range, start: float,
           stop: bool = False) -> list[Step]:
    """Steps of one world, one every second from ``start``; the last saw the stop if asked."""
    made = [Step(s, size, 0, node, pid, start + i) for i, s in enumerate(steps)]
    if stop:
        made[-1] = Step(made[-1].step, size, 0, node, pid, made[-1].mono, stop=True)
    return made


#: three nodes; node 2 killed at 10.5 s; the two left go on from 12 s
GOOD = [*_world(1, 100, 3, range(0, 10), 1.0), *_world(1, 200, 2, range(10, 20), 12.0, True)]


def test_a_good_run_breaks_nothing() -> None:
    kill = Happened("kill", 2, 10.5, 10.5)
    assert two_worlds(GOOD) == [] and steps_backwards(GOOD) == []
    assert recovery_times(GOOD, [kill]) == [1.5]
    assert recoveries(GOOD, [kill]) == []
    assert ending(GOOD, {1: 0, 2: -9, 3: 0}, min_nodes=2, final_nodes=2, spared={1, 3}) == []
    assert leftovers({}) == []


def test_two_worlds_at_once_are_named() -> None:
    # a cut-off node 1 trains on alone while nodes 2 and 3 form a world of 2
    split = [*_world(1, 100, 3, range(0, 5), 1.0), *_world(1, 300, 1, range(5, 15), 9.0),
             *_world(3, 400, 2, range(5, 15), 9.5)]
    assert two_worlds(split) == [
        "two worlds at once: world of 1 (rank 0: node 1 pid 300, round 0): steps 5-14 and "
        "world of 2 (rank 0: node 3 pid 400, round 0): steps 5-14 (overlap 8.5 s)"]
    assert len(steps_backwards(split)) == 10  # each of node 3's steps after node 1's same one
    assert [w.rank0 for w in worlds(split)] == [(1, 100), (1, 300), (3, 400)]


def test_steps_going_back_are_named_and_a_skipped_step_is_not() -> None:
    repeated = [*_world(1, 100, 2, range(0, 5), 1.0), *_world(2, 200, 1, range(4, 6), 8.0)]
    assert steps_backwards(repeated) == ["step 4 (node 2 pid 200) came after step 4 "
                                         "(node 1 pid 100)"]
    skipped = [*_world(1, 100, 2, range(0, 5), 1.0), *_world(2, 200, 1, range(6, 8), 8.0)]
    assert steps_backwards(skipped) == []


def test_a_slow_or_missing_recovery_is_named() -> None:
    freeze = Happened("freeze", 3, 4.0, 9.0)
    late = [*_world(1, 100, 3, range(0, 3), 1.0), *_world(1, 200, 2, range(3, 5), 40.0)]
    assert recovery_times(late, [freeze]) == [31.0]
    assert recoveries(late, [freeze]) == ["freeze of node 3: a new world stepped after 31.0 s "
                                          "(bound 20 s)"]
    assert recoveries(late, [freeze], {"freeze": 40.0}) == []
    # the old world stepping on after the fault is no recovery
    same = _world(1, 100, 3, range(0, 20), 1.0)
    assert recovery_times(same, [freeze]) == [None]
    assert recoveries(same, [freeze]) == ["freeze of node 3: a new world stepped never "
                                          "(bound 20 s)"]


def test_faults_at_once_recover_from_the_last_ones_end() -> None:
    # node 3 killed while node 1 is cut off for 6 s: the job waits for node 1 (MIN 2)
    kill, cut = Happened("kill", 3, 10.0, 10.0), Happened("cut", 1, 10.2, 16.0)
    run = [*_world(1, 100, 3, range(0, 9), 1.0), *_world(1, 200, 2, range(9, 12), 18.0)]
    assert recovery_times(run, [kill, cut]) == [2.0, 2.0]
    apart = Happened("cut", 1, 12.0, 16.0)  # began 2 s after the kill: a fault of its own
    assert recovery_times(run, [kill, apart]) == [8.0, 2.0]


def test_a_bad_ending_is_named() -> None:
    unstopped = GOOD[:-1]
    assert ending(unstopped, {1: 0, 3: 1}, min_nodes=2, final_nodes=3, spared={1, 3}) == [
        "the last step (18) was not the one that saw the stop",
        "the job ended at a world of 2, not 3",
        "node 3 ended with 1, not 0"]
    assert ending(GOOD, {1: 0, 3: None}, min_nodes=2, final_nodes=2, spared={1, 3}) == [
        "node 3 ended with None, not 0"]
    assert ending([], {}, min_nodes=2, final_nodes=2, spared=set()) == ["no step was logged"]


def test_leftovers_are_named() -> None:
    assert leftovers({42: "python -m unirank run x"}) == [
        "left running: pid 42 python -m unirank run x"]


def test_step_lines_parse_as_the_program_writes_them() -> None:
    line = {"step": 3, "world": 2, "sum": 2, "round": 1, "node": 2, "pid": 7, "mono": 5.5,
            "real": 1.0e9, "stop": False}
    assert parse_steps([json.dumps(line), "", json.dumps({**line, "step": 4, "stop": True})]) \
        == [Step(3, 2, 1, 2, 7, 5.5), Step(4, 2, 1, 2, 7, 5.5, stop=True)]


def test_a_step_in_flight_when_its_node_froze_is_named_not_counted() -> None:
    """Node 1 (rank 0 of the world of 3) froze at 5.5 s in the middle of step 5, which it
    stamps once resumed at 12 s; nodes 2 and 3 redid it from 9 s. That one step is named and
    left out; a second step of that world after the freeze is a second world."""
    freeze = Happened("freeze", 1, 5.5, 12.0)
    before = _world(1, 100, 3, range(0, 5), 1.0)
    winners = _world(2, 200, 2, range(5, 9), 9.0)
    late = Step(5, 3, 0, 1, 100, 11.95)
    run = [*before, *winners, late]
    assert two_worlds(run) and steps_backwards(run)  # as stamped
    assert in_flight(run, [freeze]) == [late]
    assert two_worlds(trained(run, [freeze])) == []
    assert steps_backwards(trained(run, [freeze])) == []
    another = Step(6, 3, 0, 1, 100, 12.2)
    assert two_worlds(trained([*run, another], [freeze]))
    fresh = Step(5, 1, 1, 1, 300, 11.95)  # a world started on node 1 after the freeze
    assert in_flight([*before, *winners, fresh], [freeze]) == []
