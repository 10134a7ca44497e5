"""A node's memory keeps the newest steps it holds its share of, at any number of nodes: with
three nodes or more no node ever holds a step whole (its own ranks' files and its peer's
copies: two parts of three), and a rule counting whole steps never dropped one (the memory
grew by a step at every save). Step folders in a test folder, a real DCP metadata record."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex

from unirank.runtime.snapshotcopies import Gathered, mark_held, share_of
from unirank.runtime.snapshots import _begin, drop_old, held_steps
from unirank.statekeep.copies import NodeStep, Transfer, replicate
from unirank.statekeep.rules import HELD, KEEP_IN_MEMORY, METADATA, PAGES, WHOLE

SIZE = 16
#: the files of a step of a world of three ranks, one node each
PARTS = [f"__{rank}_0.distcp" for rank in range(3)]


def _step(memory: Path, step: int, names: list[str]) -> Path:
    """A step folder holding ``names`` (each SIZE bytes, its checksum beside it) and DCP's
    metadata naming the three ranks' files."""
    folder = memory / f"step-{step}"
    folder.mkdir(parents=True)
    for name in names:
        (folder / name).write_bytes(bytes([step]) * SIZE)
        (folder / f"{name}.crc32").write_text("00000000")
    storage = {MetadataIndex(f"w{rank}"): _StorageInfo(name, 0, SIZE)
               for rank, name in enumerate(PARTS)}
    with open(folder / METADATA, "wb") as fh:
        pickle.dump(Metadata({}, storage_data=storage), fh)
    return folder


def _share(names: list[str]) -> set[str]:
    return {*names, *(f"{name}.crc32" for name in names)}


def test_a_node_of_three_drops_all_but_its_two_newest_held_steps(tmp_path: Path) -> None:
    mine = [PARTS[0], PARTS[2]]  # its rank's file and its peer's copy (rank 2's node)
    for step in range(6):
        _step(tmp_path, step, mine)
        assert mark_held(str(tmp_path), step, _share(mine)) is False  # never whole
    assert held_steps(str(tmp_path)) == frozenset(range(6))
    assert not (tmp_path / "step-5" / WHOLE).exists()
    _step(tmp_path, 6, [PARTS[0]])  # being written
    drop_old(str(tmp_path), 6, KEEP_IN_MEMORY, in_memory=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == [PAGES, "step-4", "step-5", "step-6"]
    # the newest dropped step's files wait for the next save's to be written over them
    assert sorted(os.listdir(tmp_path / PAGES)) == sorted(_share(mine))


def test_a_step_whose_share_has_not_all_come_is_not_held(tmp_path: Path) -> None:
    _step(tmp_path, 3, [PARTS[0]])  # the peer's copy never came
    assert mark_held(str(tmp_path), 3, _share([PARTS[0], PARTS[2]])) is False
    assert not (tmp_path / "step-3" / HELD).exists()
    assert held_steps(str(tmp_path)) == frozenset()
    for step in (4, 5):
        _step(tmp_path, step, [PARTS[0], PARTS[2]])
        mark_held(str(tmp_path), step, _share([PARTS[0], PARTS[2]]))
    drop_old(str(tmp_path), 6, KEEP_IN_MEMORY, in_memory=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == [PAGES, "step-4", "step-5"]


def test_a_step_held_whole_is_marked_whole_and_held(tmp_path: Path) -> None:
    """Two nodes (or a node's own world): the share is the whole step, the mark unirank run's
    copy to disk at the end reads is written too."""
    _step(tmp_path, 2, PARTS)
    assert mark_held(str(tmp_path), 2) is True
    assert (tmp_path / "step-2" / WHOLE).exists() and (tmp_path / "step-2" / HELD).exists()
    assert held_steps(str(tmp_path)) == {2}


def test_a_step_saved_again_stops_counting_and_keeps_none_of_its_earlier_copies(
        tmp_path: Path) -> None:
    """After a restore the program saves a step its node held from before: a peer's copy left
    there would pass for the new save's (same name, same size) and never be sent again."""
    folder = _step(tmp_path, 7, [PARTS[0], PARTS[2]])
    mark_held(str(tmp_path), 7, _share([PARTS[0], PARTS[2]]))
    _begin(str(folder), in_memory=True)
    assert held_steps(str(tmp_path)) == frozenset()
    assert folder.is_dir() and list(folder.iterdir()) == []


def test_a_node_s_share_is_what_it_held_at_the_gather_and_what_was_sent_to_it() -> None:
    own = {"a": NodeStep({PARTS[0]: SIZE, METADATA: 1}, frozenset(PARTS)),
           "b": NodeStep({PARTS[1]: SIZE}), "c": NodeStep({PARTS[2]: SIZE})}
    holdings = {node: {9: step} for node, step in own.items()}
    moves = replicate(holdings, 9, ["a", "b", "c"])
    gathered = Gathered(holdings, {"a": 0, "b": 1, "c": 2}, ["a", "b", "c"], [], True, "b")
    assert share_of(gathered, moves, 9) == {PARTS[0], PARTS[1], METADATA}
    assert Transfer("a", "b", PARTS[0], SIZE) in moves
