"""The program's call that restores a job's state: :func:`load_state` (and the step it takes,
:func:`restore_point`, which :func:`unirank.state_reader` shares), on top of
torch.distributed.checkpoint (DCP), whose planner reshards a state at a new world size.

Which step a world restores, and from where, is the rule of
:func:`unirank.statekeep.rules.choose`; each node is first sent, from the other nodes'
memory, what it lacks of a step taken from memory; rank 0 says it in one line. The save side
and the tiers: :mod:`.snapshots`.

Reads: what :mod:`.snapshots` reads (UNIRANK_STATE_MEMORY, UNIRANK_STATE_DIR).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from unirank.hang.phases import phase
from unirank.runtime import state
from unirank.runtime.snapshotcopies import Gathered, carry, gather, mark_held
from unirank.runtime.snapshots import (
    _collective,
    _group,
    _need_group,
    _previous_save,
    _say,
    _tiers,
    complete_steps,
)
from unirank.statekeep.copies import fill, memory_step, newest_in_part
from unirank.statekeep.rules import METADATA, Choice, choose, step_folder

__all__ = ["RestorePoint", "load_state", "restore_point", "restored_from"]


#: given a step's metadata, the files a rank reads at its restore (None: every file)
Reads = Callable[[str], frozenset[str] | None]


@phase("load_state")
def load_state(obj: dict[str, Any], *,
               folder: str | os.PathLike[str] | None = None) -> int | None:
    """Fill ``obj`` in place (DCP's ``load``: tensors copied into, other values replaced) with
    the newest snapshot the world can read, and return its step; None where there is none
    (``obj`` untouched). Every rank calls it, after the process group started. The newest
    step the nodes' memory holds between them wins (each node is first sent, from the other
    nodes' memory, what its ranks read of it and it lacks), else the newest step in
    ``folder`` (default UNIRANK_STATE_DIR); rank 0 says in one line which step came from where
    (:func:`restored_from` says it too)."""
    from unirank.runtime.snapshotread import files_to_read

    point = restore_point("load_state", folder, lambda path: files_to_read(obj, path))
    choice, disk, began = point.choice, point.disk, point.began
    if point.path is None or choice.step is None:
        return None
    from torch.distributed.checkpoint.filesystem import FileSystemReader
    from torch.distributed.checkpoint.state_dict_loader import load

    from unirank.runtime.snapshotread import MemoryReader, plain_shard_layouts

    reader = MemoryReader if choice.tier == "memory" else FileSystemReader
    try:
        with plain_shard_layouts():
            load(obj, storage_reader=reader(point.path), no_dist=not _group())
    except Exception as exc:  # DCP raises on every rank alike (it gathers the ranks' errors)
        if choice.tier != "memory" or disk is None:
            raise
        _say(f"the nodes' memory could not restore step {choice.step} "
             f"({type(exc).__name__}): trying the disk folder")
        return _from_disk(obj, disk, point.gathered.disk, began)
    _say(f"{choice.describe()} in {time.monotonic() - began:.2f} s")
    return choice.step


@dataclass(frozen=True)
class RestorePoint:
    """What a world restores (:func:`restore_point`): the rule's choice, the world's
    holdings, the chosen step's folder (None: nothing to restore), the disk folder, and when
    the restore began (time.monotonic())."""

    choice: Choice
    gathered: Gathered
    path: str | None
    disk: str | None
    began: float


def restore_point(call: str, folder: str | os.PathLike[str] | None,
                  reads: Reads | None = None) -> RestorePoint:
    """The step a world restores, for ``ur.<call>`` (collective: every rank, after its
    process group started; the running save ends first). ``reads``: given a step's metadata,
    the files this rank will read (None: every file, as where the state to fill is not known
    yet)."""
    _need_group(call)
    _previous_save()
    memory, disk = _tiers(folder)
    began = time.monotonic()
    choice, gathered = _source(memory, disk, reads)
    tier = memory if choice.tier == "memory" else disk
    path = None if choice.step is None or tier is None else \
        os.path.join(tier, step_folder(choice.step))
    return RestorePoint(choice, gathered, path, disk, began)


def _source(memory: str | None, disk: str | None,
            reads: Reads | None = None) -> tuple[Choice, Gathered]:
    """The step the world restores and from where (:func:`unirank.statekeep.rules.choose`),
    each node first sent, from the others' memory, what it lacks of a step taken from memory
    (collective; with ``reads``, only the files its ranks read: :func:`_fill`); rank 0 says
    it where there is nothing to restore but something was seen."""
    rank = dist.get_rank() if _group() else 0
    gathered = gather(memory, complete_steps(disk), rank)
    whole = memory_step(gathered.holdings) if gathered.all_memory else None
    in_part = newest_in_part(gathered.holdings) if gathered.all_memory else None
    choice = choose(gathered.disk, whole, in_part)
    state.STATE.state_restored = choice.describe()
    if choice.step is None:
        if (memory_step(gathered.holdings) is not None or in_part is not None
                or any(gathered.disk)):
            _say(choice.describe())
    elif choice.tier == "memory":
        assert memory is not None
        _fill(gathered, memory, choice.step, rank, reads)
        if gathered.acts(rank):
            mark_held(memory, choice.step)
    return choice, gathered


def _fill(gathered: Gathered, memory: str, step: int, rank: int, reads: Reads | None) -> None:
    """Each node sent what it lacks of ``step`` (collective): with ``reads``, first the
    metadata, then, once every rank planned its load from it, only the files the node's ranks
    read."""
    moves = fill(gathered.holdings, step, gathered.order)
    if reads is None or not _collective():
        carry(moves, gathered, memory, step, rank)
        return
    carry([m for m in moves if m.name == METADATA], gathered, memory, step, rank)
    dist.barrier()  # the node's other ranks read the metadata its agent received
    mine = reads(os.path.join(memory, step_folder(step), METADATA))
    planned: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(planned, [gathered.own_node, None if mine is None else sorted(mine)])
    wanted: dict[str, frozenset[str] | None] = {}
    for node, files in planned:
        known = wanted.get(node, frozenset())
        wanted[node] = None if files is None or known is None else known | frozenset(files)
    moves = fill(gathered.holdings, step, gathered.order, wanted)
    carry([m for m in moves if m.name != METADATA], gathered, memory, step, rank)


def _from_disk(obj: dict[str, Any], disk: str, disk_by_rank: list[frozenset[int]],
               began: float) -> int | None:
    """The newest step every rank finds in the disk folder, after the memory failed."""
    from torch.distributed.checkpoint.filesystem import FileSystemReader
    from torch.distributed.checkpoint.state_dict_loader import load

    choice = choose(disk_by_rank, None)
    state.STATE.state_restored = choice.describe()
    if choice.step is None:
        _say(choice.describe())
        return None
    from unirank.runtime.snapshotread import plain_shard_layouts

    with plain_shard_layouts():
        load(obj, storage_reader=FileSystemReader(os.path.join(disk, step_folder(choice.step))),
             no_dist=not _group())
    _say(f"{choice.describe()} in {time.monotonic() - began:.2f} s")
    return choice.step


def restored_from() -> str | None:
    """What the last :func:`load_state` restored, in its one line; None before any."""
    return state.STATE.state_restored
