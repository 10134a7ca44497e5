"""The fault schedules' generator (tests/integration/faults/schedule.py): pure, seeded, and
within the rules its docstring gives, over many seeds."""

from __future__ import annotations

import sys
from collections import Counter
from itertools import groupby
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from faults.schedule import (
    GAP,
    HANG_TIMEOUT,
    MIN_OUTAGE,
    PERMANENT,
    TRANSIENT,
    Fault,
    Schedule,
    generate,
)

SEEDS = range(500)


def test_a_seed_gives_one_schedule() -> None:
    assert generate(7) == generate(7)
    assert len({generate(seed) for seed in range(50)}) == 50


def test_schedules_keep_their_rules() -> None:
    for seed in SEEDS:
        _check_rules(generate(seed))


def _check_rules(schedule: Schedule) -> None:
    assert schedule.nodes in (3, 4) and schedule.min_nodes == 2
    assert schedule.final_nodes >= schedule.min_nodes
    assert [f.at for f in schedule.faults] == sorted(f.at for f in schedule.faults)
    groups = [list(g) for _, g in groupby(schedule.faults, key=lambda f: f.at)]
    assert 1 <= len(groups) <= 3
    for group in groups:
        assert len(group) <= 2
        assert [f.target for f in group].count("server") <= 1
        assert sum(f.kind in PERMANENT for f in group) <= 1
        if len(group) == 2:
            assert "stuck" not in {f.kind for f in group}
    for before, after in zip(groups, groups[1:]):
        settle = HANG_TIMEOUT if before[0].kind == "stuck" else 0.0
        assert after[0].at - max(f.end for f in before) >= GAP[0] + settle
    for fault in schedule.faults:
        if fault.kind in ("freeze", "cut"):
            assert fault.duration >= MIN_OUTAGE
        assert (fault.duration > 0) == (fault.kind in TRANSIENT)


def test_every_kind_and_pairs_come_up() -> None:
    faults = [f for seed in SEEDS for f in generate(seed).faults]
    kinds = Counter((f.kind, f.target) for f in faults)
    assert set(kinds) == {(k, t) for k in ("kill", "freeze", "cut", "replace")
                          for t in ("server", "other")} | {("stuck", "other")}
    pairs = [s for s in map(generate, SEEDS) if len({f.at for f in s.faults}) < len(s.faults)]
    assert len(pairs) > 50


def test_faults_refuse_what_cannot_happen() -> None:
    with pytest.raises(ValueError, match="stuck rank"):
        Fault(1.0, "stuck", "server")
    with pytest.raises(ValueError, match="duration is wanted"):
        Fault(1.0, "freeze", "other")
    with pytest.raises(ValueError, match="no duration is wanted"):
        Fault(1.0, "kill", "other", duration=2.0)
    with pytest.raises(ValueError, match="no such fault"):
        Fault(1.0, "melt", "other")


def test_a_schedule_says_itself_and_what_it_leaves() -> None:
    schedule = Schedule(3, 4, 2, (Fault(2.0, "kill", "server"),
                                  Fault(2.0, "freeze", "other", 1, 6.0),
                                  Fault(20.0, "stuck", "other")))
    assert schedule.final_nodes == 2 and schedule.end == 20.0
    assert schedule.describe() == ("seed 3: 4 nodes (min 2): 2.0s kill server, "
                                   "2.0s freeze other#1 for 6.0s, 20.0s stuck other#0")
