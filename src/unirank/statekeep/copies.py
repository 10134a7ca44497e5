"""Which node's memory holds which snapshot file, and which files go where (pure).

Each node keeps a step's files in one folder of its memory: the files its own ranks wrote, the
files of the node before it in the ring (its peer's), and ``.metadata``. After a save, each
node sends its own files to the next node in the ring (nodes in the order of their first
rank), so every file is in two nodes' memory; ``.metadata`` goes to every node. At a restore,
the world takes the newest step whose metadata some node holds and whose files the nodes hold
between them (a node lost with its peer leaves a hole: that step is not taken), and each node
is sent what it lacks, so that every rank then reads its node's folder alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from unirank.statekeep.rules import METADATA, checksum_of

__all__ = ["NodeStep", "Transfer", "fill", "memory_step", "newest_in_part", "node_order",
           "replicate"]


@dataclass(frozen=True)
class NodeStep:
    """What one node's memory holds of a step: file name -> size, and the files its
    ``.metadata`` names (None: no metadata there)."""

    held: Mapping[str, int] = field(default_factory=dict)
    needed: frozenset[str] | None = None

    def to_record(self) -> list[object]:
        return [dict(self.held), None if self.needed is None else sorted(self.needed)]

    @classmethod
    def from_record(cls, record: Sequence[object]) -> NodeStep:
        held, needed = record
        if not isinstance(held, dict) or not (needed is None or isinstance(needed, list)):
            raise ValueError(f"not a node's step record: {record!r}")
        return cls({str(k): int(v) for k, v in held.items()},
                   None if needed is None else frozenset(str(n) for n in needed))


@dataclass(frozen=True)
class Transfer:
    """One file sent from one node's memory to another's."""

    source: str
    target: str
    name: str
    size: int


#: each node's holdings, by step: node -> step -> NodeStep
Holdings = Mapping[str, Mapping[int, NodeStep]]


def node_order(first_ranks: Mapping[str, int]) -> list[str]:
    """The ring: nodes in the order of their first rank."""
    return sorted(first_ranks, key=lambda node: first_ranks[node])


def _needed(holdings: Holdings, step: int) -> frozenset[str] | None:
    for steps in holdings.values():
        found = steps.get(step)
        if found is not None and found.needed is not None:
            return found.needed
    return None


def _sizes(holdings: Holdings, step: int) -> dict[str, tuple[str, int]]:
    """Each file of ``step`` held anywhere: the first node holding it (dict order) and size."""
    where: dict[str, tuple[str, int]] = {}
    for node, steps in holdings.items():
        for name, size in steps.get(step, NodeStep()).held.items():
            where.setdefault(name, (node, size))
    return where


def memory_step(holdings: Holdings) -> int | None:
    """The newest step the nodes' memory holds whole between them: its metadata somewhere,
    and every file the metadata names somewhere. None: no such step."""
    steps = {step for node_steps in holdings.values() for step in node_steps}
    for step in sorted(steps, reverse=True):
        needed = _needed(holdings, step)
        if needed is not None and needed <= set(_sizes(holdings, step)):
            return step
    return None


def newest_in_part(holdings: Holdings) -> int | None:
    """The newest step whose metadata some node holds but whose files the nodes do not hold
    between them (a node lost before its copy of that step reached its peer, or with its
    peer). None: no such step."""
    whole = memory_step(holdings)
    for step in sorted({s for node_steps in holdings.values() for s in node_steps}, reverse=True):
        if whole is not None and step <= whole:
            return None
        if _needed(holdings, step) is not None:
            return step
    return None


def fill(holdings: Holdings, step: int, order: Sequence[str],
         reads: Mapping[str, frozenset[str] | None] | None = None) -> list[Transfer]:
    """What each node of ``order`` lacks of ``step`` (the metadata, every file it names and
    those files' checksums where held), each sent from the first node in ``order`` that holds
    it; where ``reads`` names the files a node's ranks read at the restore (None for a node:
    every file), only those of them (the others stay where they are: a node never gets the
    whole job's state only to read its own part)."""
    needed = _needed(holdings, step)
    if needed is None:
        return []
    ordered = {node: holdings.get(node, {}) for node in order}
    where = _sizes(ordered, step)
    moves = []
    for node in order:
        held = ordered[node].get(step, NodeStep()).held
        wanted = (reads or {}).get(node)
        files = sorted((needed if wanted is None else needed & wanted) - {METADATA})
        for name in [*files, *map(checksum_of, files), METADATA]:  # the metadata last
            if name not in held and name in where:
                source, size = where[name]
                moves.append(Transfer(source, node, name, size))
    return moves


def replicate(holdings: Holdings, step: int, order: Sequence[str]) -> list[Transfer]:
    """After a save of ``step``: each node's files to the next node of the ring ``order``
    (its peer), and the metadata to every node that lacks it. One node: nothing."""
    if len(order) < 2:
        return []
    where = _sizes({node: holdings.get(node, {}) for node in order}, step)
    moves = []
    for index, node in enumerate(order):
        before = order[index - 1]
        held = holdings.get(node, {}).get(step, NodeStep()).held
        theirs = holdings.get(before, {}).get(step, NodeStep()).held
        for name in sorted(theirs):
            if name != METADATA and name not in held:
                moves.append(Transfer(before, node, name, theirs[name]))
        if METADATA not in held and METADATA in where:
            source, size = where[METADATA]
            moves.append(Transfer(source, node, METADATA, size))
    return moves
