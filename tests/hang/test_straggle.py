"""Stragglers (pure): the rule that names a rank that kept the others waiting, when a run is
long enough to say anything, the block ``unirank run`` prints and the ``--timeline`` rows
(golden files in tests/fixtures/hang; regenerate with ``UNIRANK_REGEN_GOLDEN=1`` and review
the diff); and the sampled time in collectives (:class:`WaitMeter`) over given looks."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from unirank.hang.straggle import (
    Straggler,
    collective_rows,
    find_stragglers,
    long_enough,
    render_block,
)
from unirank.hang.waits import WaitMeter, in_flight

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "hang"


def record(rank: int, in_s: float, wall_s: float = 40.0, node: str = "node1",
           interval: float = 5.0) -> dict[str, Any]:
    return {"rank": rank, "node": node,
            "collectives": {"in_s": in_s, "wall_s": wall_s, "samples": int(wall_s * 20),
                            "interval": interval},
            "watcher": {"cpu_s": 0.01, "ticks": 8}}


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("UNIRANK_REGEN_GOLDEN") == "1":
        path.write_text(text)
    assert path.exists(), f"no golden file {path}: run with UNIRANK_REGEN_GOLDEN=1"
    assert text == path.read_text()


def test_the_rank_far_below_the_others_median_is_named_with_its_margin() -> None:
    found = find_stragglers({0: 0.80, 1: 0.78, 2: 0.05, 3: 0.82}, {2: "node2"})
    assert [(s.rank, s.node) for s in found] == [(2, "node2")]
    assert found[0].margin == pytest.approx(0.75)


def test_the_margin_must_exceed_twenty_points() -> None:
    assert find_stragglers({0: 0.50, 1: 0.50, 2: 0.30}) == []  # exactly 0.20: not named
    assert [s.rank for s in find_stragglers({0: 0.50, 1: 0.50, 2: 0.29})] == [2]


def test_two_ranks_the_one_that_waits_far_less_is_named_one_rank_never() -> None:
    assert find_stragglers({0: 0.70, 1: 0.10}) == [Straggler(1, "", pytest.approx(0.60))]
    assert find_stragglers({0: 0.10, 1: 0.25}) == []
    assert find_stragglers({0: 0.0}) == []


def test_several_slow_ranks_are_each_named_but_not_a_slow_majority() -> None:
    few = {r: 0.8 for r in range(8)} | {5: 0.1, 6: 0.1}
    assert [s.rank for s in find_stragglers(few)] == [5, 6]
    most = {r: 0.1 for r in range(8)} | {0: 0.8, 1: 0.8, 2: 0.8}
    assert find_stragglers(most) == []


def test_a_balanced_run_names_nobody() -> None:
    assert find_stragglers({0: 0.81, 1: 0.93, 2: 0.74, 3: 0.88}) == []


def test_long_enough_is_two_intervals_and_two_seconds_of_the_median_rank() -> None:
    assert not long_enough([])
    assert not long_enough([record(0, 0.5, wall_s=9.9), record(1, 0.5, wall_s=9.9)])
    assert long_enough([record(0, 0.5, wall_s=10.0), record(1, 0.5, wall_s=10.0)])
    fast = [record(r, 0.5, wall_s=1.9, interval=0.25) for r in range(2)]
    assert not long_enough(fast)
    assert long_enough([record(r, 0.5, wall_s=2.0, interval=0.25) for r in range(2)])
    # the timeline alone (no hang watcher): nothing measured
    assert not long_enough([{"rank": 0, "node": "a", "times": {"started": 1.0}}])


def test_block_golden_per_rank() -> None:
    records = [record(0, 32.1), record(1, 31.0), record(2, 30.2, node="node2"),
               record(3, 4.4, node="node2")]
    text = render_block(records[::-1])
    check_golden("stragglers_4.txt", text)
    assert text.splitlines()[-1] == ("unirank run: rank 3 (node2) kept the others waiting 66 % "
                                     "of the time")


def test_block_golden_grouped_above_eight_ranks() -> None:
    records = [record(r, 30.0 + r % 3, node=f"node{r // 4 + 1}") for r in range(16)]
    records[9] = record(9, 2.0, node="node3")
    check_golden("stragglers_16.txt", render_block(records, prog="unirank"))


def test_no_block_for_a_short_run() -> None:
    assert render_block([record(0, 0.2, wall_s=1.0), record(1, 0.9, wall_s=1.0)]) == ""


def test_timeline_rows_name_the_rank_that_spent_the_least() -> None:
    rows = collective_rows([record(0, 30.0), record(1, 20.0, node="b"), record(2, 32.0)])
    assert rows == [("in collectives (s)", [20.0, 30.0, 32.0], "rank 1 on b (least)"),
                    ("in collectives (%)", [50.0, 75.0, 80.0], "rank 1 on b (least)")]
    assert collective_rows([{"rank": 0, "node": "a", "times": {}}]) == []


def status(entered: int, done: int) -> dict[str, dict[str, str]]:
    return {"0": {"last_enqueued_collective": str(entered),
                  "last_completed_collective": str(done)}}


def test_in_flight_over_every_group() -> None:
    both = {**status(4, 4), "1": {"last_enqueued_collective": "2",
                                  "last_completed_collective": "1"}}
    assert in_flight(both) == (True, 11)
    assert in_flight(status(-1, -1)) == (False, 0)


def test_meter_counts_the_time_before_each_look_that_sees_a_collective_in_flight() -> None:
    meter = WaitMeter()
    meter.look(0.0, None)  # no torch.distributed yet
    meter.look(1.0, status(-1, -1))  # a group, no collective yet: the window has not begun
    looks = [(2.0, status(1, 0)), (2.5, status(1, 0)), (3.0, status(1, 1)),
             (4.0, status(2, 1)), (5.0, status(2, 2)), (9.0, status(2, 2))]
    for now, seen in looks:
        meter.look(now, seen)
    # in flight at 2.5 (0.5 s) and 4.0 (1 s); the window ends at 5.0, when #2 completed
    assert meter.summary() == {"in_s": 1.5, "wall_s": 3.0, "samples": 6}
