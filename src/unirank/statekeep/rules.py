"""The rules of snapshots (pure; no torch, no files but the listing given).

A tier (the node's memory, the disk folder the program names) holds one folder per step,
``step-<n>``, laid out as torch.distributed.checkpoint's file system storage lays out a
checkpoint: each rank's ``__<rank>_<i>.distcp`` files and, written last and atomically by the
coordinating rank once every rank's files were written, ``.metadata``. A step counts in a
tier only where its ``.metadata`` is there and every file the metadata names is there too.

Every rank restores the same step: the newest step that every rank of the world finds
complete in some tier, each rank from its first tier that holds it (memory, then disk). A
step none of them hold in full is never restored in part.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = [
    "KEEP_IN_MEMORY",
    "KEEP_ON_DISK",
    "METADATA",
    "TIERS",
    "Choice",
    "Holdings",
    "choose",
    "parse_step",
    "persists",
    "step_folder",
    "to_drop",
]

#: the file DCP writes last, once every rank's files are written
METADATA = ".metadata"
#: the tiers in the order a rank restores from them
TIERS = ("memory", "disk")
#: complete steps a node keeps in memory (the newest, and the one before while the next is
#: written: a save under way never leaves the node with none)
KEEP_IN_MEMORY = 2
#: complete steps kept in the disk folder
KEEP_ON_DISK = 2
_STEP = re.compile(r"step-(\d{1,18})")


def step_folder(step: int) -> str:
    """The name of a step's folder in a tier."""
    if step < 0:
        raise ValueError(f"a step is 0 or more, not {step}")
    return f"step-{step}"


def parse_step(name: str) -> int | None:
    """The step of a folder name :func:`step_folder` made; None for any other name."""
    match = _STEP.fullmatch(name)
    return int(match.group(1)) if match else None


def persists(step: int, every: int, stopping: bool) -> bool:
    """Whether the snapshot of ``step`` also goes to disk: every ``every``-th step, and at a
    stop (a stop that gives time: the newest step must outlive the job)."""
    return stopping or (every > 0 and step % every == 0)


def to_drop(complete: Iterable[int], keep: int, writing: int | None = None) -> list[int]:
    """The complete steps a tier drops: all but the newest ``keep`` (never the step being
    written)."""
    steps = sorted(set(complete), reverse=True)
    return sorted(s for s in steps[keep:] if s != writing)


@dataclass(frozen=True)
class Holdings:
    """The complete steps one rank can read, by tier."""

    memory: frozenset[int] = frozenset()
    disk: frozenset[int] = frozenset()

    def tier_of(self, step: int) -> str | None:
        """The first tier holding ``step``, in :data:`TIERS` order; None where none does."""
        for tier in TIERS:
            if step in getattr(self, tier):
                return tier
        return None

    def to_record(self) -> list[list[int]]:
        """What a rank sends the others (sorted lists, one per tier)."""
        return [sorted(getattr(self, tier)) for tier in TIERS]

    @classmethod
    def from_record(cls, record: Sequence[Sequence[int]]) -> Holdings:
        return cls(**{tier: frozenset(int(s) for s in steps)
                      for tier, steps in zip(TIERS, record, strict=True)})


@dataclass(frozen=True)
class Choice:
    """The step a world restores (None: none held by every rank) and each rank's tier."""

    step: int | None
    tiers: tuple[str, ...] = ()

    def describe(self) -> str:
        """One line: where the world's state came from."""
        if self.step is None:
            return "no snapshot held by every rank: starting afresh"
        kinds = sorted(set(self.tiers), key=TIERS.index)
        where = " and ".join("the nodes' memory" if t == "memory" else "the disk folder"
                             for t in kinds)
        return f"state of step {self.step} restored from {where}"


def choose(ranks: Sequence[Holdings]) -> Choice:
    """The newest step every rank can read in some tier, and each rank's first tier for it."""
    if not ranks:
        return Choice(None)
    shared = None
    for holdings in ranks:
        steps = holdings.memory | holdings.disk
        shared = steps if shared is None else shared & steps
    if not shared:
        return Choice(None)
    step = max(shared)
    return Choice(step, tuple(str(h.tier_of(step)) for h in ranks))
