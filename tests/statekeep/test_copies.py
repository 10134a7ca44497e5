"""Which node's memory holds which snapshot file, and which files go where (pure): each
node's files to the next node of the ring after a save; at a restore, the newest step the
nodes hold whole between them, and what each node lacks."""

from __future__ import annotations

from pathlib import Path

import pytest

from unirank.statekeep.copies import (
    NodeStep,
    Transfer,
    fill,
    memory_step,
    newest_in_part,
    node_order,
    replicate,
)

META = ".metadata"
FILES = frozenset({"__0_0.distcp", "__1_0.distcp", "__2_0.distcp"})


def _own(*names: str, meta: bool = False) -> NodeStep:
    held = {name: 10 for name in names}
    if meta:
        held[META] = 1
    return NodeStep(held, FILES if meta else None)


def test_the_ring_follows_the_nodes_first_ranks() -> None:
    assert node_order({"b": 4, "a": 0, "c": 8}) == ["a", "b", "c"]


def test_after_a_save_each_node_s_files_go_to_the_next_and_the_metadata_everywhere() -> None:
    held = {"a": {7: _own("__0_0.distcp", meta=True)}, "b": {7: _own("__1_0.distcp")},
            "c": {7: _own("__2_0.distcp")}}
    moves = replicate(held, 7, ["a", "b", "c"])
    assert moves == [
        Transfer("c", "a", "__2_0.distcp", 10),
        Transfer("a", "b", "__0_0.distcp", 10), Transfer("a", "b", META, 1),
        Transfer("b", "c", "__1_0.distcp", 10), Transfer("a", "c", META, 1),
    ]


def test_one_node_keeps_its_snapshot_to_itself() -> None:
    assert replicate({"a": {7: _own("__0_0.distcp", meta=True)}}, 7, ["a"]) == []


def _after_replication() -> dict[str, dict[int, NodeStep]]:
    return {"a": {7: _own("__0_0.distcp", "__2_0.distcp", meta=True)},
            "b": {7: _own("__1_0.distcp", "__0_0.distcp", meta=True)},
            "c": {7: _own("__2_0.distcp", "__1_0.distcp", meta=True)}}


@pytest.mark.parametrize("lost", ["a", "b", "c"])
def test_any_one_lost_node_leaves_the_step_whole(lost: str) -> None:
    held = {node: steps for node, steps in _after_replication().items() if node != lost}
    assert memory_step(held) == 7


def test_a_node_lost_with_its_peer_leaves_a_hole() -> None:
    held = {"c": _after_replication()["c"]}  # a and b lost: a's file was on a and b only
    assert memory_step(held) is None
    assert newest_in_part(held) == 7


def test_a_step_held_in_part_is_named_only_where_newer_than_the_whole_one() -> None:
    whole = _after_replication()
    assert newest_in_part(whole) is None
    seven = _own("__0_0.distcp", "__1_0.distcp", "__2_0.distcp", meta=True)
    assert newest_in_part({"a": {7: seven, 8: _own("__0_0.distcp", meta=True)}}) == 8
    # files of a newer step with no metadata anywhere: a save cut short, not a lost part
    assert newest_in_part({"a": {7: seven, 8: _own("__0_0.distcp")}}) is None


def test_the_newest_whole_step_wins_over_a_newer_torn_one() -> None:
    held = {"a": {7: _own("__0_0.distcp", "__1_0.distcp", "__2_0.distcp", meta=True),
                  8: _own("__0_0.distcp", meta=True)}}
    assert memory_step(held) == 7


def test_each_node_is_sent_what_it_lacks_the_metadata_last() -> None:
    survivors = {"b": _after_replication()["b"], "c": _after_replication()["c"]}
    moves = fill(survivors, 7, ["b", "c", "new"])
    assert moves == [
        Transfer("c", "b", "__2_0.distcp", 10),
        Transfer("b", "c", "__0_0.distcp", 10),
        Transfer("b", "new", "__0_0.distcp", 10), Transfer("b", "new", "__1_0.distcp", 10),
        Transfer("c", "new", "__2_0.distcp", 10), Transfer("b", "new", META, 1),
    ]


def test_a_node_gets_only_the_files_its_ranks_read_where_their_plans_are_known() -> None:
    """A replaced node of a sharded job reads its own shard: it is sent that, not the whole
    job's state; a node whose plan is unknown (None) gets every file, as before."""
    held = {"a": {7: _own("__0_0.distcp", "__2_0.distcp", meta=True)},
            "b": {7: _own("__1_0.distcp", "__0_0.distcp", meta=True)}, "new": {}}
    order = ["a", "b", "new"]
    assert fill(held, 7, order, {"new": frozenset({"__2_0.distcp"}), "a": frozenset(),
                                 "b": frozenset({"__2_0.distcp"})}) == [
        Transfer("a", "b", "__2_0.distcp", 10),
        Transfer("a", "new", "__2_0.distcp", 10), Transfer("a", "new", META, 1)]
    assert fill(held, 7, order, {"new": None}) == fill(held, 7, order)


def test_records_cross_as_lists() -> None:
    step = _own("__0_0.distcp", meta=True)
    assert NodeStep.from_record(step.to_record()) == step
    with pytest.raises(ValueError, match="not a node's step record"):
        NodeStep.from_record(["x", None])


def test_a_file_s_checksum_travels_with_it_to_a_node_that_lacks_both() -> None:
    needed = frozenset({"__0_0.distcp", META})
    holder = NodeStep({"__0_0.distcp": 10, "__0_0.distcp.crc32": 8, META: 1}, needed)
    moves = fill({"a": {7: holder}}, 7, ["a", "new"])
    assert moves == [Transfer("a", "new", "__0_0.distcp", 10),
                     Transfer("a", "new", "__0_0.distcp.crc32", 8),
                     Transfer("a", "new", META, 1)]


def test_a_copy_that_does_not_match_its_checksum_is_found(tmp_path: Path) -> None:
    """:func:`unirank.runtime.snapshotcopies.carry` keeps no copy that arrived changed: the
    writer's checksum file beside each file, the receiver's check of what came."""
    from unirank.runtime.snapshotcopies import not_matching, write_checksums

    for name in ("a.distcp", "b.distcp", "c.distcp"):
        (tmp_path / name).write_bytes(bytes(range(256)) * 64)
    write_checksums(str(tmp_path), ["a.distcp", "b.distcp", META])
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "a.distcp", "a.distcp.crc32", "b.distcp", "b.distcp.crc32", "c.distcp"]
    changed = bytearray((tmp_path / "b.distcp").read_bytes())
    changed[1000] ^= 1  # one bit, at the file's full length
    (tmp_path / "b.distcp").write_bytes(bytes(changed))
    # c has no checksum: taken as it came (a file written before checksums)
    assert not_matching(str(tmp_path), ["a.distcp", "b.distcp", "c.distcp",
                                        "b.distcp.crc32"]) == ["b.distcp"]
