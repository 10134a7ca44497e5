"""What ``ur.save_state`` hands its thread (:mod:`unirank.runtime.snapshotstaging`): small
tensors and every other value copied at once, large tensors by reference with their version
counters; a large tensor changed in place before the thread wrote it is found, the step is
not kept (its metadata taken away), the line is said once, and that tensor is copied at once
from then on. In-process, no process group (one process alone)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from unirank.runtime import snapshots
from unirank.runtime.snapshotstaging import stage
from unirank.statekeep.rules import COPY_NOW_BYTES, METADATA, copied_now, step_folder

BIG = COPY_NOW_BYTES // 4 + 1  # float32 elements: one more than copied at once


def test_small_or_once_torn_tensors_are_copied_at_once() -> None:
    assert copied_now(COPY_NOW_BYTES, "model/w", frozenset())
    assert not copied_now(COPY_NOW_BYTES + 1, "model/w", frozenset())
    assert copied_now(COPY_NOW_BYTES + 1, "model/w", frozenset({"model/w"}))


class Counter:
    """A DCP ``Stateful``: its state dict is taken at the save."""

    def __init__(self) -> None:
        self.n = 1

    def state_dict(self) -> dict[str, Any]:
        return {"n": self.n}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.n = state["n"]


def test_the_staged_copy_keeps_large_tensors_by_reference_and_copies_the_rest() -> None:
    big, small, groups = torch.zeros(BIG), torch.zeros(4), [{"lr": 0.1}]
    counter = Counter()
    staged = stage({"model": {"big": big, "small": small}, "groups": groups,
                    "counter": counter}, frozenset())
    assert staged.obj["model"]["big"] is big
    assert staged.obj["model"]["small"] is not small
    small.add_(1.0)
    groups[0]["lr"] = 0.2
    counter.n = 2
    assert float(staged.obj["model"]["small"][0]) == 0.0
    assert staged.obj["groups"] == [{"lr": 0.1}] and staged.obj["counter"] == {"n": 1}
    assert staged.changed() == []
    big.add_(1.0)  # an in-place change outside an optimizer's step, before the thread wrote
    assert staged.changed() == ["model/big"]


def test_a_dtensor_s_change_through_its_local_shard_is_seen(tmp_path: Path) -> None:
    """``to_local().add_()`` moves the shard's version counter, not the DTensor's."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        param = DTensor.from_local(torch.zeros(BIG), mesh, [Shard(0)], run_check=False)
        staged = stage({"w": param}, frozenset())
        assert staged.obj["w"] is param and staged.changed() == []
        param.to_local().add_(1.0)
        assert staged.changed() == ["w"]
    finally:
        dist.destroy_process_group()


def test_a_step_changed_while_written_is_not_kept_and_said_once(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(snapshots, "_torn", set())
    monkeypatch.setattr(snapshots, "_SAID", snapshots._Said())
    memory = tmp_path / "memory"
    for step in (1, 2):
        folder = memory / step_folder(step)
        folder.mkdir(parents=True)
        (folder / METADATA).write_bytes(b"")
        staged = stage({"w": torch.zeros(BIG)}, frozenset(snapshots._torn))
        staged.torn = ["w"]
        snapshots._keep(str(memory), None, step, staged, None)
        assert not os.path.exists(folder / METADATA)  # the step no longer counts
    assert snapshots._torn == {"w"}
    said = capsys.readouterr().err.splitlines()
    assert said == ["unirank: the snapshot of step 1 was not kept: w changed in place while it "
                    "was written (outside an optimizer's step); copied before save_state "
                    "returns from now on"]
    assert stage({"w": torch.zeros(BIG)}, frozenset(snapshots._torn)).versions == {}


def _data_crcs(folder: Path) -> list[int]:
    """The CRC-32 fields of the tensors' records in a step folder's files."""
    import zipfile

    crcs = []
    for path in sorted(folder.iterdir()):
        if path.suffix == ".distcp" and zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                crcs += [info.CRC for info in archive.infolist() if "/data/" in info.filename]
    return crcs


def test_the_memory_tier_writes_no_checksums_the_disk_tier_does(tmp_path: Path) -> None:
    """torch.save's CRC-32 is half a memory write's time and nothing reads it; the disk
    folder's files keep it (a zip tool may test them); the switch is torch's again after."""
    from torch.utils import serialization

    saved = torch.arange(float(BIG))
    for tier, in_memory in (("memory", True), ("disk", False)):
        snapshots._save_to(str(tmp_path / tier), 0, {"w": saved}, True, 2, in_memory=in_memory)
        assert serialization.config.save.compute_crc32
    memory_crcs = _data_crcs(tmp_path / "memory" / step_folder(0))
    disk_crcs = _data_crcs(tmp_path / "disk" / step_folder(0))
    assert memory_crcs == [0] and len(disk_crcs) == 1 and disk_crcs[0] != 0
    restored = {"w": torch.zeros(BIG)}
    from torch.distributed.checkpoint import load

    from unirank.runtime.snapshotread import MemoryReader

    load(restored, storage_reader=MemoryReader(str(tmp_path / "memory" / step_folder(0))),
         no_dist=True)
    assert torch.equal(restored["w"], saved)


@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_a_plain_layout_is_torch_s_own(data: st.DataObject) -> None:
    """:func:`plain_layout` against torch's rule (``_compute_local_shape_and_global_offset``,
    which builds an index tensor): local shape and global offset alike for any plain
    placements, even and uneven splits, empty shards and dimensions sharded twice."""
    from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset
    from torch.distributed.tensor.placement_types import Partial, Replicate, Shard

    from unirank.runtime.snapshotread import plain_layout

    ndim = data.draw(st.integers(1, 3))
    shape = tuple(data.draw(st.lists(st.integers(0, 13), min_size=ndim, max_size=ndim)))
    mesh = tuple(data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
    coordinate = [data.draw(st.integers(0, size - 1)) for size in mesh]
    placements = [data.draw(st.sampled_from(
        [Replicate(), Partial(), *(Shard(d) for d in range(ndim))])) for _ in mesh]
    assert plain_layout(shape, mesh, coordinate, placements) == \
        _compute_local_shape_and_global_offset(shape, mesh, coordinate, placements)


def test_a_strided_shard_is_left_to_torch() -> None:
    from torch.distributed.tensor.placement_types import Shard, _StridedShard

    from unirank.runtime.snapshotread import plain_layout

    assert plain_layout((8,), (2, 2), [0, 1], [Shard(0), _StridedShard(0, split_factor=2)]) \
        is None
