"""The rules of snapshots (pure): which step a world restores and from where, what a tier
keeps, when a snapshot goes to disk."""

from __future__ import annotations

import pytest

from unirank.statekeep.rules import (
    Choice,
    Holdings,
    choose,
    parse_step,
    persists,
    step_folder,
    to_drop,
)


def _h(memory: set[int] = set(), disk: set[int] = set()) -> Holdings:  # noqa: B006
    return Holdings(frozenset(memory), frozenset(disk))


def test_the_newest_step_every_rank_holds_wins_from_memory_first() -> None:
    choice = choose([_h({4, 5}, {0}), _h({4, 5}, {0})])
    assert choice == Choice(5, ("memory", "memory"))
    assert choice.describe() == "state of step 5 restored from the nodes' memory"


def test_a_step_one_rank_lacks_is_never_restored_in_part() -> None:
    # rank 1 lost its memory (a new node): step 5 is only in rank 0's memory
    choice = choose([_h({4, 5}, {0}), _h(set(), {0})])
    assert choice == Choice(0, ("disk", "disk"))
    assert choice.describe() == "state of step 0 restored from the disk folder"


def test_ranks_may_read_the_same_step_from_different_tiers() -> None:
    choice = choose([_h({10}, {10}), _h(set(), {10})])
    assert choice == Choice(10, ("memory", "disk"))
    assert "the nodes' memory and the disk folder" in choice.describe()


def test_nothing_held_by_every_rank_starts_afresh() -> None:
    assert choose([_h({3}), _h({4})]).step is None
    assert choose([]).step is None
    assert choose([_h(), _h()]).describe() == "no snapshot held by every rank: starting afresh"


def test_a_rank_s_holdings_cross_as_lists() -> None:
    held = _h({2, 1}, {0})
    assert held.to_record() == [[1, 2], [0]]
    assert Holdings.from_record(held.to_record()) == held


def test_step_folders() -> None:
    assert step_folder(12) == "step-12"
    assert parse_step("step-12") == 12
    assert parse_step("step-12.tmp") is None
    assert parse_step("owner.json") is None
    with pytest.raises(ValueError, match="0 or more"):
        step_folder(-1)


def test_a_tier_keeps_its_newest_steps_and_never_the_one_written() -> None:
    assert to_drop({1, 2, 3, 4}, keep=2) == [1, 2]
    assert to_drop({1, 2, 3}, keep=2, writing=1) == []
    assert to_drop({5}, keep=2) == []


def test_disk_every_k_steps_and_at_a_stop() -> None:
    assert [s for s in range(25) if persists(s, 10, stopping=False)] == [0, 10, 20]
    assert persists(7, 10, stopping=True)
    assert not persists(7, 0, stopping=False)


def test_the_docs_show_the_line_the_code_says() -> None:
    from pathlib import Path

    docs = (Path(__file__).resolve().parents[2] / "docs" / "state.md").read_text()
    assert f"unirank: {Choice(3, ('memory', 'memory')).describe()} in " in docs
