"""The stragglers rule while the job runs (unirank.hang.slowrank), over synthetic records:
no name under +-20 % step jitter over a simulated 10 minutes, a rank cut to half its speed
named within 20 s, its recovery said once, a hang's window left out."""

from __future__ import annotations

import random
from typing import Any

import pytest

from unirank.hang.slowrank import (
    Change,
    Slow,
    change_line,
    decode_named,
    encode_named,
    observe,
)
from unirank.hang.straggle import Straggler
from unirank.hang.view import make_view

PERIOD = 5.0  # the detector's default interval: a look and a record per rank each


def record(rank: int, time: float, in_s: float, **more: Any) -> dict[str, Any]:
    return {"rank": rank, "node": f"node{rank}", "time": time, "in_s": in_s, "groups": [],
            **more}


def simulate(ranks: int, seconds: float, step: float, *, jitter: float = 0.2,
             slow: int | None = None, cut: tuple[float, float] = (0.0, 0.0), factor: float = 2.0,
             seed: int = 0, offsets: bool = True) -> list[tuple[float, Change]]:
    """Synchronous steps (compute, then one all-reduce of 5 ms): rank ``slow`` computes
    ``factor`` times slower between the times of ``cut``; each rank's record every PERIOD s
    (each at its own phase where ``offsets``), a look every PERIOD s; the changes and when."""
    rng = random.Random(seed)
    phase = [rng.uniform(0, PERIOD) if offsets else 0.0 for _ in range(ranks)]
    t, in_s = 0.0, [0.0] * ranks
    latest: dict[int, dict[str, Any] | None] = dict.fromkeys(range(ranks))
    due = list(phase)
    look, state, said = PERIOD, Slow(), []
    while t < seconds:
        costs = [step * (1 + rng.uniform(-jitter, jitter))
                 * (factor if r == slow and cut[0] <= t < cut[1] else 1.0) for r in range(ranks)]
        longest = max(costs)
        for r in range(ranks):
            in_s[r] += longest - costs[r] + 0.005
        t += longest + 0.005
        for r in range(ranks):
            while due[r] <= t:
                latest[r] = record(r, t, in_s[r])
                due[r] += PERIOD
        while look <= t:
            state, changes = observe(state, latest, hung=False)
            said += [(look, c) for c in changes]
            look += PERIOD
    return said


@pytest.mark.parametrize("ranks", [2, 4, 8])
@pytest.mark.parametrize("step", [0.05, 0.3, 1.0])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_no_straggler_in_ten_minutes_of_jitter(ranks: int, step: float, seed: int) -> None:
    assert simulate(ranks, 600.0, step, seed=seed) == []


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("step", [0.05, 0.3, 1.0])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_rank_at_half_speed_is_named_within_20_s(ranks: int, step: float, seed: int
                                                   ) -> None:
    said = simulate(ranks, 300.0, step, slow=ranks - 1, cut=(60.0, 1e9), seed=seed)
    assert said, "not named"
    when, first = said[0]
    assert first.slow and first.straggler.rank == ranks - 1
    assert first.straggler.node == f"node{ranks - 1}"
    assert 60.0 < when <= 80.0
    assert first.straggler.margin > 0.3
    assert len(said) == 1  # named once, not at every look


def test_recovery_is_said_once() -> None:
    said = simulate(2, 300.0, 0.1, slow=1, cut=(60.0, 150.0), seed=4)
    assert [(c.slow, c.straggler.rank) for _, c in said] == [(True, 1), (False, 1)]
    assert 150.0 < said[1][0] <= 175.0
    assert "no longer keeps the others waiting" in change_line(said[1][1])


def test_one_slow_window_names_nobody() -> None:
    said = simulate(2, 300.0, 0.1, slow=1, cut=(60.0, 64.0), factor=4.0, seed=5,
                    offsets=False)
    assert said == []


def test_a_hang_restarts_the_streaks() -> None:
    state = Slow()
    seen = []
    for k in range(6):  # rank 1 never waits, rank 0 waits 60 %: slow in every window
        records = {0: record(0, 5.0 * k, 3.0 * k), 1: record(1, 5.0 * k, 0.0)}
        state, changes = observe(state, records, hung=k == 2)
        seen.append([c.straggler.rank for c in changes])
    # windows end at looks 1, (2: hang), 3 (first after it: a start), 4, 5
    assert seen == [[], [], [], [], [1], []]
    assert set(state.named) == {1}


def test_an_ended_rank_leaves_the_named() -> None:
    state = Slow()
    for k in range(4):
        state, _ = observe(state, {0: record(0, 5.0 * k, 3.0 * k),
                                   1: record(1, 5.0 * k, 0.0)}, hung=False)
    assert set(state.named) == {1}
    state, changes = observe(state, {0: record(0, 20.0, 12.0),
                                     1: record(1, 20.0, 0.0, finished=True)}, hung=False)
    assert changes == [] and dict(state.named) == {}


def test_the_line_and_the_stored_value() -> None:
    change = Change(Straggler(3, "node2", 0.381), True, 15.2)
    assert change_line(change) == ("unirank: straggler: rank 3 (node2) keeps the others "
                                   "waiting 38 % of the time (last 15 s)\n")
    state = Slow(named={3: change.straggler})
    assert decode_named(encode_named(state)) == (Straggler(3, "node2", 0.381),)
    assert decode_named(b"not json") == ()


def test_the_view_marks_slow_by_the_same_window_rule() -> None:
    """`unirank top` and the detector judge a window alike (hang.view.share_of)."""
    old = {0: record(0, 0.0, 0.0), 1: record(1, 0.0, 0.0)}
    new = {0: record(0, 5.0, 3.0), 1: record(1, 5.0, 0.0)}
    view = make_view(old, new, 2, now=5.0)
    state, _ = observe(Slow(), old, hung=False)
    state, _ = observe(state, new, hung=False)
    assert view.marked["slow"] == [1] == [r for r, s in state.streaks.items() if s.slow]


def test_the_view_marks_slow_a_rank_the_detector_names() -> None:
    """A window that alone names nobody (`unirank top`'s 5 s) still shows the detector's
    straggler slow: the view and the detector agree."""
    old = {0: record(0, 0.0, 0.0), 1: record(1, 0.0, 0.0)}
    new = {0: record(0, 5.0, 1.0), 1: record(1, 5.0, 0.5)}
    assert make_view(old, new, 2, now=5.0).marked["slow"] == []
    named = (Straggler(1, "node1", 0.4),)
    view = make_view(old, new, 2, now=5.0, named=named)
    assert view.marked["slow"] == [1]
    assert "rank 1 (node1) keeps the others waiting: 40 % of the time" in view.notes
