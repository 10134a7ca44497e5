"""The rules of snapshots (pure): which step a world restores and from where, what a tier
keeps, when a snapshot goes to disk."""

from __future__ import annotations

import pytest

from unirank.statekeep.rules import (
    Choice,
    choose,
    parse_step,
    persists,
    step_folder,
    to_drop,
)


def test_the_nodes_memory_wins_over_an_older_or_equal_disk_step() -> None:
    assert choose([frozenset({0}), frozenset({0})], 5) == Choice(5, "memory")
    assert choose([frozenset({5})], 5) == Choice(5, "memory")
    assert choose([frozenset({5})], 5).describe() == \
        "state of step 5 restored from the nodes' memory"


def test_the_disk_serves_what_memory_lacks_for_every_rank() -> None:
    assert choose([frozenset({0, 10}), frozenset({10})], None) == Choice(10, "disk")
    assert choose([frozenset({0, 10}), frozenset({10})], 4) == Choice(10, "disk")
    # a step one rank lacks on disk is never restored in part
    assert choose([frozenset({0, 10}), frozenset({0})], None) == Choice(0, "disk")
    assert Choice(0, "disk").describe() == "state of step 0 restored from the disk folder"


def test_nothing_held_starts_afresh() -> None:
    assert choose([frozenset({3}), frozenset({4})], None).step is None
    assert choose([], None).step is None
    assert Choice(None).describe() == "no snapshot held by every rank: starting afresh"


def test_a_newer_step_the_memory_holds_in_part_is_named_with_the_reason() -> None:
    chosen = choose([frozenset({0}), frozenset({0})], None, in_part=3)
    assert chosen == Choice(0, "disk", 3)
    assert chosen.describe() == (
        "state of step 0 restored from the disk folder (the nodes' memory holds step 3 only "
        "in part: a node was lost before its copy reached its peer, or with its peer)")
    assert choose([frozenset(), frozenset()], None, in_part=3).describe().startswith(
        "no snapshot held by every rank: starting afresh (the nodes' memory holds step 3")
    # older than the step taken: nothing to explain
    assert choose([frozenset({5})], None, in_part=3) == Choice(5, "disk")


def test_step_folders() -> None:
    assert step_folder(12) == "step-12"
    assert parse_step("step-12") == 12
    assert parse_step("step-12.tmp") is None
    assert parse_step("owner.json") is None
    with pytest.raises(ValueError, match="0 or more"):
        step_folder(-1)


def test_a_tier_keeps_its_newest_whole_steps_and_what_is_newer() -> None:
    assert to_drop({1, 2, 3, 4}, {1, 2, 3, 4}, keep=2) == [1, 2]
    # step 5 on its way (not whole yet), a torn step 0 of an earlier attempt
    assert to_drop({0, 1, 2, 3, 5}, {1, 2, 3}, keep=2) == [0, 1]
    assert to_drop({1, 2, 3}, {1, 2, 3}, keep=2, writing=1) == []
    assert to_drop({4, 5}, {5}, keep=2) == []  # fewer whole steps than kept: nothing goes


def test_disk_every_k_steps_and_at_a_stop() -> None:
    assert [s for s in range(25) if persists(s, 10, stopping=False)] == [0, 10, 20]
    assert persists(7, 10, stopping=True)
    assert not persists(7, 0, stopping=False)


def test_the_docs_show_the_line_the_code_says() -> None:
    from pathlib import Path

    docs = (Path(__file__).resolve().parents[2] / "docs" / "state.md").read_text()
    assert f"unirank: {Choice(3, 'memory').describe()} in " in docs
    flat = " ".join(docs.split())
    assert f"unirank: {Choice(0, 'disk', 3).describe()} in " in flat


def test_a_run_ends_copying_its_newest_whole_step_only_where_newer_than_the_disk_s() -> None:
    from unirank.statekeep.rules import to_flush

    assert to_flush([3, 4], [0]) == 4
    assert to_flush([4], []) == 4
    assert to_flush([4], [4]) is None
    assert to_flush([4], [6]) is None
    assert to_flush([], [1]) is None
