"""The program's call that keeps a job's state, :func:`save_state`, and the tiers it keeps it
in, on top of torch.distributed.checkpoint (DCP), whose planner reshards a state at a new
world size (the restore: :mod:`.snapshotload`).

Under ``unirank run`` each snapshot goes to the node's memory (``/dev/shm``, kept by the run
across worker restarts: :mod:`unirank.statekeep.memory`) and, every ``persist_every`` steps
and once a stop was agreed (:func:`unirank.stop_requested`), to the disk folder the program
names. Under any other launcher (torchrun, srun, a plain ``python``) the same calls use the
disk folder only, and rank 0 says so once. Which step a world restores, and from where, is
the rule of :func:`unirank.statekeep.rules.choose`; rank 0 says it in one line.

Reads: UNIRANK_STATE_MEMORY (:func:`unirank.statekeep.memory.memory_folder_of`),
UNIRANK_STATE_DIR (the disk folder where the call names none), UNIRANK_STATE_BUDGET (the
memory's budget: :mod:`unirank.statekeep.budget`).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from unirank.contract import STATE_BUDGET_VAR, STATE_DIR_VAR
from unirank.hang.phases import phase
from unirank.runtime import state
from unirank.runtime.preemption import _STOP
from unirank.runtime.snapshotcopies import (
    carry,
    gather,
    mark_held,
    node_step,
    share_of,
    write_checksums,
)
from unirank.runtime.snapshotpages import give_back, uncount, waiting_bytes
from unirank.runtime.snapshotstaging import BACKGROUND, Staged, stage, state_group
from unirank.statekeep.budget import DEFAULT_BUDGET, parse_budget, refusal
from unirank.statekeep.copies import replicate
from unirank.statekeep.memory import memory_folder_of, note_disk_folder
from unirank.statekeep.rules import (
    HELD,
    KEEP_IN_MEMORY,
    KEEP_ON_DISK,
    METADATA,
    parse_step,
    persists,
    step_folder,
    to_drop,
)

__all__ = ["any_rank", "complete_steps", "drop_old", "held_steps", "save_state"]

#: how often a snapshot goes to disk too, by default (a stop always sends it)
PERSIST_EVERY = 10


@dataclass
class _Said:
    """What rank 0 already said once."""

    no_memory: bool = False
    nowhere: bool = False
    budget: bool = False
    torn: bool = False


_SAID = _Said()


def _say(line: str) -> None:
    if state.get_rank() == 0:
        sys.stderr.write(f"unirank: {line}\n")
        sys.stderr.flush()


def _disk_folder(folder: str | os.PathLike[str] | None,
                 environ: Mapping[str, str]) -> str | None:
    chosen = os.fspath(folder) if folder is not None else environ.get(STATE_DIR_VAR, "")
    return chosen or None


def _tiers(folder: str | os.PathLike[str] | None) -> tuple[str | None, str | None]:
    """The node's memory (None: no ``unirank run``) and the disk folder (None: none named);
    the first time either is missing, rank 0 says what that means."""
    memory, disk = memory_folder_of(os.environ), _disk_folder(folder, os.environ)
    if memory is None and disk is None and not _SAID.nowhere:
        _SAID.nowhere = True
        _say("the job's state is not kept: no unirank run holds it in memory and no folder "
             f"was named (give folder= or set {STATE_DIR_VAR})")
    elif memory is None and not _SAID.no_memory:
        _SAID.no_memory = True
        _say(f"no unirank run here: the job's state is kept in {disk} only")
    return memory, disk


def _group() -> bool:
    """Whether a default process group is live (DCP then saves and loads collectively)."""
    return dist.is_available() and dist.is_initialized()


def _need_group(call: str) -> None:
    """Refuse a call of a rank of a world larger than 1 made before its process group started
    (its ranks would write the same files, each as the only one)."""
    if not _group() and state.get_world_size() > 1:
        raise RuntimeError(f"ur.{call} needs the job's process group: call it after ur.init() "
                           "(or torch.distributed.init_process_group), on every rank")


def _collective() -> bool:
    return _group() and dist.get_world_size() > 1


def _save_to(tier: str, step: int, obj: dict[str, Any], coordinator: bool,
             keep: int, *, in_memory: bool = False, group: Any = None) -> dict[str, str]:
    """One DCP save of ``obj`` to ``tier``'s step folder (collective where a group is live;
    ``in_memory``: the node's memory, one file per item: :mod:`.snapshotread`).
    The ``coordinator`` of the tier's folder (rank 0 on disk, the node's first rank in
    memory) first takes away the step's ``.metadata`` from an earlier save, so that the step
    counts again only once DCP renamed the new one in, and afterwards drops the oldest
    steps. Over ``group`` (default: the job's). The files this rank wrote in memory, with
    their CRC-32s."""
    # on first use: it costs a program's import time
    from torch.distributed.checkpoint.filesystem import FileSystemWriter
    from torch.distributed.checkpoint.state_dict_saver import save

    from unirank.runtime.snapshotread import (
        MemoryWriter,
        memory_writer,
        plain_shard_layouts,
        without_checksums,
    )

    path = os.path.join(tier, step_folder(step))
    if coordinator:
        _begin(path, in_memory=in_memory)
    writer = memory_writer(path) if in_memory else FileSystemWriter(path)
    with without_checksums() if in_memory else contextlib.nullcontext(), plain_shard_layouts():
        save(obj, storage_writer=writer, process_group=group, no_dist=not _group())
    if coordinator:
        drop_old(tier, step, keep, in_memory=in_memory)
    return writer.sums if isinstance(writer, MemoryWriter) else {}


def drop_old(tier: str | None, step: int, keep: int, *, in_memory: bool = False) -> None:
    """A tier's steps older than its newest ``keep`` whole ones (never ``step``, being
    written); in a node's memory, older than the newest ``keep`` it holds its share of
    (:func:`held_steps`: with three nodes or more no node holds a step whole),
    and the newest dropped step's pages wait for the next save
    (:func:`.snapshotpages.give_back`)."""
    if tier is None:
        return
    counted = held_steps(tier) if in_memory else complete_steps(tier)
    for old in to_drop(_present(tier), counted, keep, writing=step):  # oldest first
        if in_memory:
            give_back(tier, os.path.join(tier, step_folder(old)))
        else:
            _remove(os.path.join(tier, step_folder(old)))


def any_rank(flag: bool, group: Any = None) -> bool:
    """Whether ``flag`` holds on some rank (every rank calls it, over ``group``: default the
    job's; a world of one: its own)."""
    if not _collective():
        return flag
    found = torch.tensor([int(flag)])
    dist.all_reduce(found, op=dist.ReduceOp.MAX, group=group)
    return bool(found.item())


def _present(tier: str) -> list[int]:
    """Every step folder of a tier, whole or not."""
    with contextlib.suppress(OSError):
        return [s for s in map(parse_step, os.listdir(tier)) if s is not None]
    return []


def _begin(path: str, *, in_memory: bool) -> None:
    """A save of a step begins (its tier's coordinator, before any rank writes): the step's
    folder stops counting; in a node's memory the files it held from an earlier save of the
    same step (the program saves a step again after a restore) go too, the peer's copies
    among them: a copy held from before would pass for this save's and never be sent again.
    The folder itself stays (the node's other ranks may have made it already)."""
    uncount(path)
    if not in_memory:
        return
    with contextlib.suppress(OSError):
        for entry in os.scandir(path):
            if entry.is_file():
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)


def _remove(path: str) -> None:
    uncount(path)  # first: the step stops counting at once
    import shutil

    shutil.rmtree(path, ignore_errors=True)


@phase("save_state")  # slow on purpose: the learned hang timeout waits (hang/phases.py)
def save_state(step: int, obj: dict[str, Any], *, folder: str | os.PathLike[str] | None = None,
               persist_every: int = PERSIST_EVERY) -> None:
    """Keep ``obj`` (a state dict: tensors, nested dicts, picklable values) as the snapshot of
    ``step``. Every rank calls it at the same steps with its own state (DCP's rules: a
    tensor saved by several ranks is written once). Under ``unirank run`` it goes to the
    node's memory, and each node's files to the next node's memory (two copies of each);
    also to ``folder`` (default UNIRANK_STATE_DIR) every ``persist_every`` steps (0: never but
    at a stop) and always once the ranks agreed to stop (:func:`unirank.stop_requested`).
    Under ``unirank run`` it returns once the state is staged, and a thread writes it while
    the loop goes on (:mod:`.snapshotstaging`: an optimizer's next ``step()`` waits until it
    is written). Without ``unirank run``: to ``folder`` only, each call, before it returns.
    A step counts only once every rank's part is written; each tier keeps its newest steps
    (2 in memory, 2 on disk)."""
    if step < 0:
        raise ValueError(f"a step is 0 or more, not {step}")
    if persist_every < 0:
        raise ValueError(f"persist_every is 0 or more, not {persist_every}")
    _need_group("save_state")
    _previous_save()
    memory, disk = _tiers(folder)
    if memory is not None and _over_budget(
            memory, _part_bytes(obj) * max(state.get_local_world_size(), 1)):
        memory = None
    to_disk = disk if disk is not None and (
        memory is None or persists(step, persist_every, _STOP.agreed)) else None
    if memory is None:
        if to_disk is not None:
            _save_to(to_disk, step, obj, state.get_rank() == 0, KEEP_ON_DISK)
        return
    first = state.get_local_rank() == 0
    if first and disk is not None:
        note_disk_folder(memory, os.path.abspath(disk))
    staged = stage(obj, frozenset(_torn))
    group = state_group() if _collective() else None
    BACKGROUND.start(lambda: _write(memory, to_disk, step, staged, group),
                     lambda: _keep(memory, to_disk, step, staged, group))
    if _STOP.agreed:  # the job ends next: this step is kept before the call returns
        _previous_save()


#: the paths of tensors the program changed while a save wrote them: copied at once since
_torn: set[str] = set()


def _previous_save() -> None:
    """The running save ends first (a ``dcp.save`` of a :class:`.snapshotdcp.StateWriter` that
    failed on rank 0 ends now); one that failed fails this call."""
    BACKGROUND.settle()
    BACKGROUND.join()
    error, BACKGROUND.error = BACKGROUND.error, None
    if error is not None:
        raise RuntimeError(f"ur.save_state: the last snapshot could not be kept ({error})") \
            from error


def _write(memory: str, disk: str | None, step: int, staged: Staged, group: Any) -> None:
    """The thread's first half: the step into the node's memory (and the folder where due),
    then the tensors kept by reference checked unchanged (:meth:`Staged.changed`)."""
    first = state.get_local_rank() == 0
    staged.written = _save_to(memory, step, staged.obj, first, KEEP_IN_MEMORY, in_memory=True,
                              group=group)
    if disk is not None:
        _save_to(disk, step, staged.obj, state.get_rank() == 0, KEEP_ON_DISK, group=group)
    staged.torn = staged.changed()


def _keep(memory: str, disk: str | None, step: int, staged: Staged, group: Any) -> None:
    """The thread's second half, while the loop goes on: where any rank's tensor changed
    while it was written, the step does not count (its metadata taken away); else the
    copies to the peer node (each rank's files with their checksums, written first)."""
    write_checksums(os.path.join(memory, step_folder(step)), list(staged.written),
                    staged.written)
    if any_rank(bool(staged.torn), group):
        _torn.update(staged.torn)
        for tier in (memory, disk):
            if tier is not None:
                uncount(os.path.join(tier, step_folder(step)))
        if not _SAID.torn:
            _SAID.torn = True
            which = ", ".join(staged.torn) or "a tensor of another rank"
            _say(f"the snapshot of step {step} was not kept: {which} changed in place while "
                 "it was written (outside an optimizer's step); copied before save_state "
                 "returns from now on")
        return
    if _collective():
        _to_peers(memory, step, group)
    elif state.get_local_rank() == 0:
        mark_held(memory, step)


def _part_bytes(obj: Any) -> int:
    """The bytes of the tensors in a state dict (a DTensor's local shard)."""
    if isinstance(obj, Mapping):
        return sum(_part_bytes(v) for v in obj.values())
    if isinstance(obj, list | tuple):
        return sum(_part_bytes(v) for v in obj)
    if isinstance(obj, torch.Tensor):
        local = obj.to_local() if hasattr(obj, "to_local") else obj
        return int(local.numel() * local.element_size())
    return 0


def _over_budget(memory: str, node_bytes: int, group: Any = None) -> bool:
    """Whether this step (``node_bytes`` of the node's ranks) stays out of the node's memory
    (the ranks agree over ``group``, default the job's: one of them over is enough); rank 0
    says why, once, the first time.

    Reads: UNIRANK_STATE_BUDGET.
    """
    room = os.statvfs(memory)
    held, waiting = _held_bytes(memory), waiting_bytes(memory)  # pages the step reuses
    available = _available_memory()
    budget = parse_budget(os.environ.get(STATE_BUDGET_VAR) or DEFAULT_BUDGET,
                          room.f_blocks * room.f_frsize, variable=STATE_BUDGET_VAR,
                          memory=None if available is None else available + held + waiting)
    need = 2 * node_bytes  # and the peer's copy
    free = room.f_bavail * room.f_frsize + waiting
    why = refusal(need, held, free, budget)
    over = any_rank(why is not None, group)
    if over and not _SAID.budget:
        _SAID.budget = True
        why = why or "a snapshot does not fit another node's snapshot memory"
        _say(f"{why}: the job's state goes to the disk folder only while it does not fit "
             f"(the budget: unirank run --state-budget or {STATE_BUDGET_VAR}, default "
             f"{DEFAULT_BUDGET} of /dev/shm or of the memory available, the smaller)")
    return over


def _available_memory() -> int | None:
    """The machine's available memory (``MemAvailable`` of ``/proc/meminfo``: snapshots in
    ``/dev/shm`` are not in it), None where not known."""
    with contextlib.suppress(OSError, ValueError), open("/proc/meminfo", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return None


def _held_bytes(memory: str) -> int:
    """The bytes of the snapshots the node's memory holds now."""
    total = 0
    for step in _present(memory):
        for top, _, names in os.walk(os.path.join(memory, step_folder(step))):
            for name in names:
                with contextlib.suppress(OSError):
                    total += os.path.getsize(os.path.join(top, name))
    return total


def _to_peers(memory: str, step: int, group: Any = None) -> None:
    """Each node's files of ``step`` to the next node's memory, the metadata to every node
    (over ``group``: default the job's)."""
    rank = dist.get_rank()
    gathered = gather(memory, frozenset(), rank, steps=[step], group=group)
    moves = replicate(gathered.holdings, step, gathered.order)
    carry(moves, gathered, memory, step, rank, group)
    if gathered.acts(rank):
        mark_held(memory, step, share_of(gathered, moves, step))


def held_steps(memory: str) -> frozenset[int]:
    """The steps a node's memory holds its share of (:data:`~unirank.statekeep.rules.HELD`,
    its metadata still there: a step written again stops counting at once,
    :func:`.snapshotpages.uncount`)."""
    return frozenset(
        step for step in _present(memory)
        if all(os.path.exists(os.path.join(memory, step_folder(step), name))
               for name in (HELD, METADATA)))


def complete_steps(tier: str | None) -> frozenset[int]:
    """The steps complete in a tier's folder: their ``.metadata`` there and every file it
    names, whole (:func:`.snapshotcopies.node_step`, the memory's rule too)."""
    if tier is None:
        return frozenset()
    found = set()
    for step in _present(tier):
        held = node_step(os.path.join(tier, step_folder(step)))
        if held.needed is not None and held.needed <= set(held.held):
            found.add(step)
    return frozenset(found)
