"""The rules of snapshots (pure; no torch, no files but the listing given).

A tier (the node's memory, the disk folder the program names) holds one folder per step,
``step-<n>``, laid out as torch.distributed.checkpoint's file system storage lays out a
checkpoint: each rank's ``__<rank>_<i>.distcp`` files and, written last and atomically by the
coordinating rank once every rank's files were written, ``.metadata``. A step counts in a
tier only where its ``.metadata`` is there and every file the metadata names is there too.

Every rank restores the same step: the newest step the nodes' memory holds whole between them
(:mod:`.copies`), or the newest step complete in the disk folder for every rank, memory first.
A step nobody holds in full is never restored in part.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = [
    "CHECKSUM",
    "COPY_NOW_BYTES",
    "HELD",
    "KEEP_IN_MEMORY",
    "KEEP_ON_DISK",
    "MARKS",
    "METADATA",
    "PAGES",
    "WHOLE",
    "Choice",
    "checksum_of",
    "checksum_text",
    "choose",
    "copied_now",
    "parse_step",
    "persists",
    "step_folder",
    "to_drop",
    "to_flush",
]

#: the file DCP writes last, once every rank's files are written
METADATA = ".metadata"
#: in a node's memory, beside a step's files: the node holds the step whole (a JSON list of
#: its files, written once its copies came; read by ``unirank run``, which imports no torch)
WHOLE = ".whole"
#: in a node's memory, beside a step's files: the node holds its share of the step (the files
#: its own ranks wrote, the copies of its peer's, the metadata: a JSON list of them), written
#: once its copies came. The memory tier keeps the newest steps held so (:func:`to_drop`): with
#: three nodes or more no node ever holds a step whole
HELD = ".held"
#: the marks a step folder of a node's memory may hold beside its files (none is a file of the
#: step; each is written under ``<mark>.<pid>`` and renamed)
MARKS = (WHOLE, HELD)
#: beside a file of a node's memory, its CRC-32 (hex), written by the rank that wrote the file
#: before its copies leave; a copy that arrives and does not match is not kept
#: (:func:`unirank.runtime.snapshotcopies.carry`)
CHECKSUM = ".crc32"
#: in a node's memory, beside its step folders: the files of the step dropped last, whose pages
#: the next save writes over (:mod:`unirank.runtime.snapshotpages`); never a step's
PAGES = ".pages"
#: steps a node keeps in memory, of those it holds its share of (:data:`HELD`: the newest,
#: and the one before while the next is written: a save under way never leaves the node with
#: none)
KEEP_IN_MEMORY = 2
#: complete steps kept in the disk folder
KEEP_ON_DISK = 2
_STEP = re.compile(r"step-(\d{1,18})")


def checksum_text(crc: int) -> str:
    """A CRC-32 as a checksum file holds it (8 hex digits)."""
    return f"{crc:08x}"


def checksum_of(name: str) -> str:
    """The name of the checksum file of the file ``name``."""
    return name + CHECKSUM


def step_folder(step: int) -> str:
    """The name of a step's folder in a tier."""
    if step < 0:
        raise ValueError(f"a step is 0 or more, not {step}")
    return f"step-{step}"


def parse_step(name: str) -> int | None:
    """The step of a folder name :func:`step_folder` made; None for any other name."""
    match = _STEP.fullmatch(name)
    return int(match.group(1)) if match else None


#: a tensor this small is copied before ``save_state`` returns (buffers a ``forward`` changes
#: in place are small; copying them costs little); larger ones are written by the thread
COPY_NOW_BYTES = 1 << 20


def copied_now(nbytes: int, path: str, torn_before: frozenset[str]) -> bool:
    """Whether ``save_state`` copies a tensor before it returns: a small one, or one that
    changed while an earlier save was writing it (the program changes it in place outside an
    optimizer's step); else the thread writes it while the loop goes on."""
    return nbytes <= COPY_NOW_BYTES or path in torn_before


def persists(step: int, every: int, stopping: bool) -> bool:
    """Whether the snapshot of ``step`` also goes to disk: every ``every``-th step, and at a
    stop (a stop that gives time: the newest step must outlive the job)."""
    return stopping or (every > 0 and step % every == 0)


def to_drop(present: Iterable[int], whole: Iterable[int], keep: int,
            writing: int | None = None) -> list[int]:
    """The step folders a tier drops: those older than the newest ``keep`` of its ``whole``
    steps (on disk: complete; in a node's memory: held, the node's share of them, as
    :data:`HELD` marks; a newer one may be on its way: kept), never the step being
    written."""
    kept = sorted(set(whole), reverse=True)[:keep]
    if len(kept) < keep:
        return []
    return sorted(s for s in set(present) if s < kept[-1] and s != writing)


def to_flush(whole_in_memory: Iterable[int], on_disk: Iterable[int]) -> int | None:
    """The step ``unirank run`` copies from the node's memory to the disk folder as the run
    ends: the newest step the node holds whole, where it is newer than every step on disk."""
    newest = max(whole_in_memory, default=None)
    if newest is None or newest <= max(on_disk, default=-1):
        return None
    return newest


@dataclass(frozen=True)
class Choice:
    """The step a world restores (None: none), the tier it comes from, and the newest step
    the nodes' memory held only in part, where it is newer (a node lost while its copy of
    that step was still on the way to its peer, or lost with its peer): the reason the
    memory's newer step was passed over."""

    step: int | None
    tier: str = ""
    in_part: int | None = None

    def describe(self) -> str:
        """One line: where the world's state came from (and why not the memory's newer
        step)."""
        if self.step is None:
            line = "no snapshot held by every rank: starting afresh"
        else:
            where = "the nodes' memory" if self.tier == "memory" else "the disk folder"
            line = f"state of step {self.step} restored from {where}"
        if self.in_part is None:
            return line
        return (f"{line} (the nodes' memory holds step {self.in_part} only in part: a node "
                "was lost before its copy reached its peer, or with its peer)")


def choose(disk_by_rank: Sequence[frozenset[int]], memory_step: int | None,
           in_part: int | None = None) -> Choice:
    """The newest step the world can restore: ``memory_step`` (the newest the nodes' memory
    holds whole, :func:`unirank.statekeep.copies.memory_step`) or the newest step complete in
    the disk folder for every rank, memory first where both hold the same step. ``in_part``
    (:func:`unirank.statekeep.copies.newest_in_part`) is named where it is newer than the
    step taken."""
    on_disk = frozenset.intersection(*disk_by_rank) if disk_by_rank else frozenset()
    newest_on_disk = max(on_disk, default=None)
    if memory_step is not None and (newest_on_disk is None or memory_step >= newest_on_disk):
        chosen = Choice(memory_step, "memory")
    elif newest_on_disk is not None:
        chosen = Choice(newest_on_disk, "disk")
    else:
        chosen = Choice(None)
    if in_part is not None and (chosen.step is None or in_part > chosen.step):
        return Choice(chosen.step, chosen.tier, in_part)
    return chosen
