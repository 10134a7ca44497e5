"""unirank's snapshot tiers as DCP storage, for a program that calls ``dcp.save``,
``dcp.async_save`` and ``dcp.load`` itself: :func:`state_writer` and :func:`state_reader`.

They keep a step where :func:`unirank.save_state` keeps it and restore what
:func:`unirank.load_state` would: under ``unirank run`` the node's memory, each node's files
also in the next node's memory, the disk folder every ``persist_every`` steps and once a stop
was agreed; under any other launcher the disk folder only. A ``dcp.save`` runs its planning and
its writes in the program's call (one write, into ``/dev/shm``); the copies to the peer node
(and to the disk folder where due) then go on in the state's thread (:mod:`.snapshotstaging`),
started by each rank once its part is written and by DCP's coordinator once ``.metadata`` is
(a save that failed on the coordinator counts for nothing: its thread tells the others so, at
the latest at the next save or load or the interpreter's exit).

Reads: what :func:`unirank.save_state` reads (UNIRANK_STATE_MEMORY, UNIRANK_STATE_DIR,
UNIRANK_STATE_BUDGET).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from typing import Any

import torch.distributed as dist
from torch.distributed.checkpoint.filesystem import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner, SavePlan, SavePlanner
from torch.distributed.checkpoint.storage import StorageWriter, WriteResult
from torch.futures import Future

from unirank.contract import STATE_DIR_VAR
from unirank.runtime import state
from unirank.runtime.preemption import _STOP
from unirank.runtime.snapshotcopies import mark_held, write_checksums
from unirank.runtime.snapshotload import restore_point
from unirank.runtime.snapshotpages import uncount
from unirank.runtime.snapshotread import (
    MemoryReader,
    memory_writer,
    plain_shard_layouts,
    without_checksums,
)
from unirank.runtime.snapshots import (
    PERSIST_EVERY,
    _begin,
    _collective,
    _need_group,
    _over_budget,
    _previous_save,
    _say,
    _tiers,
    any_rank,
    drop_old,
)
from unirank.runtime.snapshotstaging import BACKGROUND, state_group
from unirank.statekeep.memory import note_disk_folder
from unirank.statekeep.rules import (
    KEEP_IN_MEMORY,
    KEEP_ON_DISK,
    METADATA,
    persists,
    step_folder,
)

__all__ = ["StateWriter", "state_reader", "state_writer"]


def state_writer(step: int, *, folder: str | os.PathLike[str] | None = None,
                 persist_every: int = PERSIST_EVERY) -> StateWriter:
    """A DCP storage writer for the snapshot of ``step``: ``dcp.save(state,
    storage_writer=ur.state_writer(step, folder="checkpoints"))`` (or ``dcp.async_save``),
    on every rank, at the same steps, after the process group started; the tiers and
    ``folder``/``persist_every`` as :func:`unirank.save_state`'s."""
    if step < 0:
        raise ValueError(f"a step is 0 or more, not {step}")
    if persist_every < 0:
        raise ValueError(f"persist_every is 0 or more, not {persist_every}")
    _need_group("state_writer")
    memory, disk = _tiers(folder)
    if memory is None and disk is None:
        raise ValueError("ur.state_writer: no unirank run holds the state in memory and no "
                         f"folder was named: give folder= or set {STATE_DIR_VAR}")
    if memory is not None and disk is not None and state.get_local_rank() == 0:
        note_disk_folder(memory, os.path.abspath(disk))  # unirank run's copy as the run ends
    return StateWriter(step, memory, disk, persist_every)


class StateWriter(StorageWriter):
    """DCP's writer into unirank's tiers (made by :func:`state_writer`): the node's memory
    (one file per item, no CRC), else the disk folder; a writer serves one save."""

    def __init__(self, step: int, memory: str | None, disk: str | None,
                 persist_every: int) -> None:
        super().__init__()
        self.step = step
        self._memory, self._disk, self._every = memory, disk, persist_every
        self._in_memory = False
        self._to_disk: str | None = None
        self._coordinator = False
        self._group: Any = None
        self._files: list[str] = []
        self._inner: FileSystemWriter | None = None
        self._layouts = contextlib.ExitStack()

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        """The step names the folder; a ``checkpoint_id`` is not used."""

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return False

    def storage_meta(self) -> StorageMeta | None:
        return None

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        """The save before ends first; DCP's planning of DTensors with integers
        (:func:`.snapshotread.plain_shard_layouts`, until :meth:`prepare_local_plan`)."""
        _previous_save()
        self._coordinator = is_coordinator
        self._group = state_group() if _collective() else None
        self._layouts.enter_context(plain_shard_layouts())

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        """Where this step goes, agreed by the ranks: the node's memory where it fits."""
        self._layouts.close()
        memory = self._memory
        if memory is not None:
            mine = sum(item.tensor_storage_size() or 0 for item in plan.items)
            if _over_budget(memory, mine * max(state.get_local_world_size(), 1), self._group):
                memory = None
        self._in_memory = memory is not None
        due = persists(self.step, self._every, _STOP.agreed)
        self._to_disk = self._disk if self._in_memory and due else None
        tier = memory if memory is not None else self._disk
        assert tier is not None  # state_writer refused a writer with neither
        path = os.path.join(tier, step_folder(self.step))
        if self._tier_coordinator():
            _begin(path, in_memory=self._in_memory)
        if self._to_disk is not None and state.get_rank() == 0:
            uncount(os.path.join(self._to_disk, step_folder(self.step)))
        self._inner = memory_writer(path) if self._in_memory else FileSystemWriter(path)
        self._inner.set_up_storage_writer(self._coordinator)
        return self._inner.prepare_local_plan(plan)

    def _tier_coordinator(self) -> bool:
        """Who clears and drops a tier's steps: the node's first rank in memory, rank 0 on
        disk."""
        return state.get_local_rank() == 0 if self._in_memory else state.get_rank() == 0

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        assert self._inner is not None
        return self._inner.prepare_global_plan(plans)

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        """This rank's part; then, in memory, its copies start (the coordinator's once its
        ``finish`` wrote the metadata: owed until then)."""
        assert self._inner is not None
        try:
            with without_checksums() if self._in_memory else contextlib.nullcontext():
                written = self._inner.write_data(plan, planner)
                written.wait()
        except BaseException:
            if self._in_memory:  # the others' threads hear it counts for nothing
                self._copies(failed=True)
            raise
        self._files = sorted({result.storage_data.relative_path for result in written.value()})
        if self._in_memory:
            if self._coordinator:
                BACKGROUND.owe(lambda: self._copies(failed=True))
            else:
                self._copies(failed=False)
        return written

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """The coordinator's: the metadata (the step counts from then on), then its copies."""
        assert self._inner is not None
        if self._in_memory:
            BACKGROUND.owe(None)
        try:
            self._inner.finish(metadata, results)
        except BaseException:
            if self._in_memory:
                self._copies(failed=True)
            raise
        if self._in_memory:
            self._copies(failed=False)
        else:
            drop_old(self._disk, self.step, KEEP_ON_DISK)

    def _copies(self, failed: bool) -> None:
        BACKGROUND.start(lambda: None, lambda: self._keep(failed))

    def _keep(self, failed: bool) -> None:
        """The thread's part, on every rank: the ranks agree the step was written (else it
        counts nowhere), the copies to the peer node, the disk folder's copy where due, the
        oldest steps dropped."""
        assert self._memory is not None
        from unirank.runtime.snapshots import _to_peers

        if not failed:  # before the copies leave (the gather below lists them)
            write_checksums(os.path.join(self._memory, step_folder(self.step)), self._files,
                            getattr(self._inner, "sums", None))
        if any_rank(failed, self._group):
            uncount(os.path.join(self._memory, step_folder(self.step)))
            return
        if _collective():
            _to_peers(self._memory, self.step, self._group)
        elif state.get_local_rank() == 0:
            mark_held(self._memory, self.step)
        if self._to_disk is not None:
            self._persist(self._to_disk)
        if state.get_local_rank() == 0:
            drop_old(self._memory, self.step, KEEP_IN_MEMORY, in_memory=True)

    def _persist(self, disk: str) -> None:
        """Each rank copies the files it wrote to the disk folder; once all did, rank 0 the
        metadata (last: the step counts from then on)."""
        assert self._memory is not None
        source = os.path.join(self._memory, step_folder(self.step))
        target = os.path.join(disk, step_folder(self.step))
        os.makedirs(target, exist_ok=True)
        for name in self._files:
            shutil.copyfile(os.path.join(source, name), os.path.join(target, name))
        if _collective():
            dist.barrier(group=self._group)
        if state.get_rank() == 0:
            part = os.path.join(target, METADATA + ".part")
            shutil.copyfile(os.path.join(source, METADATA), part)
            os.replace(part, os.path.join(target, METADATA))
            drop_old(disk, self.step, KEEP_ON_DISK)


class _Restoring:
    """What a reader made by :func:`state_reader` adds to DCP's: the step, DTensor layouts
    planned with integers, and rank 0's one line once the step is read."""

    def __init__(self, path: str, *, step: int, line: str, began: float) -> None:
        super().__init__(path)  # type: ignore[call-arg]
        self.step = step
        self._line, self._began = line, began
        self._layouts = contextlib.ExitStack()

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool,
                              *args: Any, **kwargs: Any) -> None:
        self._layouts.enter_context(plain_shard_layouts())
        super().set_up_storage_reader(metadata, is_coordinator,  # type: ignore[misc]
                                      *args, **kwargs)

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        self._layouts.close()
        return super().prepare_local_plan(plan)  # type: ignore[misc,no-any-return]

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        read: Future[None] = super().read_data(plan, planner)  # type: ignore[misc]
        read.wait()
        _say(f"{self._line} in {time.monotonic() - self._began:.2f} s")
        return read


class StateMemoryReader(_Restoring, MemoryReader):
    """DCP's reader of a step in the nodes' memory (:func:`state_reader`)."""


class StateDiskReader(_Restoring, FileSystemReader):
    """DCP's reader of a step in the disk folder (:func:`state_reader`)."""


def state_reader(*, folder: str | os.PathLike[str] | None = None
                 ) -> StateMemoryReader | StateDiskReader | None:
    """A DCP storage reader of the newest snapshot the world can read (the step
    :func:`unirank.load_state` would restore; each node is first sent what it lacks), or None
    where there is none: ``reader = ur.state_reader(folder="checkpoints")``, then
    ``dcp.load(state, storage_reader=reader)``; ``reader.step`` is its step. Every rank calls
    it, after the process group started (it is collective); rank 0 says where the step came
    from once it is read (:func:`unirank.restored_from` says it from the call on)."""
    point = restore_point("state_reader", folder)
    choice = point.choice
    if point.path is None or choice.step is None:
        return None
    reader = StateMemoryReader if choice.tier == "memory" else StateDiskReader
    return reader(point.path, step=choice.step, line=choice.describe(), began=point.began)
