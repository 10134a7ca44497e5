"""The snapshot files' travels between nodes' memory, over the job's own process group.

Each node's first rank (its agent) lists what the node's memory holds
(:func:`node_holdings`); the ranks gather the lists (:func:`gather`); the pure rules of
:mod:`unirank.statekeep.copies` say which files go where; :func:`carry` sends them with
point-to-point sends of the job's group, each file mapped from ``/dev/shm`` into a tensor on
both sides (no copy but the wire's), written under a temporary name and renamed when whole.

Reads: nothing from the environment.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import pickle
import socket
import sys
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from unirank.runtime.snapshotpages import take_pages
from unirank.statekeep.copies import NodeStep, Transfer
from unirank.statekeep.rules import (
    CHECKSUM,
    HELD,
    MARKS,
    METADATA,
    WHOLE,
    checksum_of,
    checksum_text,
    parse_step,
    step_folder,
)

__all__ = ["Gathered", "carry", "crc_of", "gather", "mark_held", "node_holdings",
           "node_step", "not_matching", "share_of", "write_checksums"]

#: the suffix of a file on its way in
_PART = ".part"
#: map a file's pages at once (Linux)
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)


def node_step(path: str) -> NodeStep:
    """What one step folder of a node's memory holds (whole files only)."""
    held: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for entry in os.scandir(path):
            if entry.is_file() and not entry.name.endswith(_PART) and \
                    not entry.name.startswith(MARKS):
                held[entry.name] = entry.stat().st_size
    needed = None
    if METADATA in held:
        lengths: dict[str, int] = {}
        with contextlib.suppress(OSError, pickle.UnpicklingError, AttributeError, EOFError):
            with open(os.path.join(path, METADATA), "rb") as fh:
                storage = pickle.load(fh).storage_data  # DCP's record (torch's class)
            for entry in storage.values():
                end = int(entry.offset) + int(entry.length)
                lengths[entry.relative_path] = max(lengths.get(entry.relative_path, 0), end)
            needed = frozenset(lengths)
        for name, length in lengths.items():  # a truncated copy is not held
            if held.get(name, length) < length:
                del held[name]
    return NodeStep(held, needed)


def node_holdings(memory: str | None, steps: Sequence[int] | None = None) -> dict[int, NodeStep]:
    """What a node's memory holds, by step (only ``steps`` where given)."""
    if memory is None:
        return {}
    found: dict[int, NodeStep] = {}
    with contextlib.suppress(OSError):
        for name in os.listdir(memory):
            step = parse_step(name)
            if step is not None and (steps is None or step in steps):
                found[step] = node_step(os.path.join(memory, name))
    return found


@dataclass(frozen=True)
class Gathered:
    """The world's answer: each node's holdings, the rank that acts for each node, the ring,
    each rank's disk steps, and whether every rank has a node memory (a rank without one
    cannot read from memory)."""

    holdings: Mapping[str, Mapping[int, NodeStep]]
    agents: Mapping[str, int]
    order: list[str]
    disk: list[frozenset[int]]
    all_memory: bool
    own_node: str

    def acts(self, rank: int) -> bool:
        """Whether ``rank`` acts for its node (its first rank)."""
        return self.agents.get(self.own_node) == rank


def _node_id(memory: str | None) -> str:
    """A node's memory, named across the world (the folder's name is random per run)."""
    return f"{socket.gethostname()}:{memory}" if memory else f"none:{os.getpid()}"


def gather(memory: str | None, disk: frozenset[int], rank: int,
           steps: Sequence[int] | None = None, group: Any = None) -> Gathered:
    """Every rank's node, holdings (of ``steps``) and disk steps, over ``group`` (default:
    the job's); a single process alone."""
    own = _node_id(memory)
    mine = [own, rank, {s: h.to_record() for s, h in node_holdings(memory, steps).items()},
            sorted(disk), memory is not None]
    records: list[Any] = [mine]
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        records = [None] * dist.get_world_size()
        dist.all_gather_object(records, mine, group=group)
    agents: dict[str, int] = {}
    holdings: dict[str, dict[int, NodeStep]] = {}
    for node, r, held, _, has_memory in records:
        if has_memory and (node not in agents or r < agents[node]):
            agents[node] = r
            holdings[node] = {int(s): NodeStep.from_record(h) for s, h in held.items()}
    order = sorted(agents, key=lambda node: agents[node])
    return Gathered(holdings, agents, order, [frozenset(r[3]) for r in records],
                    all(r[4] for r in records), own)


def carry(moves: Sequence[Transfer], gathered: Gathered, memory: str | None, step: int,
          rank: int, group: Any = None) -> int:
    """Send and receive this rank's part of ``moves``, all at once (each move its own tag:
    every rank walks the same list); a received file is renamed in place once every transfer
    ended, in the list's order (the metadata comes last); the bytes this node received.
    Over ``group`` (default: the job's; its ranks are the job's)."""
    folder = os.path.join(memory, step_folder(step)) if memory else ""
    works: list[Any] = []
    arriving: list[tuple[str, mmap.mmap | None]] = []
    leaving: list[mmap.mmap] = []
    for tag, move in enumerate(moves):
        source, target = gathered.agents[move.source], gathered.agents[move.target]
        if rank == source and move.size:
            leaving.append(_mapped(os.path.join(folder, move.name), move.size))
            data = torch.frombuffer(leaving[-1], dtype=torch.uint8)
            works.append((dist.isend(data, target, group=group, tag=tag), data))
            del data
        elif rank == target:
            os.makedirs(folder, exist_ok=True)
            part = os.path.join(folder, move.name + _PART)
            view = _arrival(memory, part, move.size)
            arriving.append((part, view))
            if view is not None:
                works.append(_receive(view, source, group, tag))
    for work, _ in works:
        work.wait()
    works.clear()  # the received tensors: before the files' maps close
    sums = {}
    for part, arrived in arriving:
        os.replace(part, part.removesuffix(_PART))
        sums[os.path.basename(part.removesuffix(_PART))] = \
            checksum_text(zlib.crc32(arrived) if arrived is not None else 0)
    for mapped in [*leaving, *(arrived for _, arrived in arriving if arrived is not None)]:
        with contextlib.suppress(BufferError):  # a tensor on it still alive: at its end
            mapped.close()
    names = list(sums)
    for name in not_matching(folder, names, sums):  # not kept: then whole elsewhere
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(folder, name))
        sys.stderr.write(f"unirank: the copy of {name} of step {step} that came to this node "
                         "does not match its checksum: not kept (another copy, an earlier "
                         "step or the disk folder serves)\n")
        sys.stderr.flush()
    return sum(os.path.getsize(os.path.join(folder, n)) for n in names
               if os.path.exists(os.path.join(folder, n)))


def _receive(view: mmap.mmap, source: int, group: Any, tag: int) -> tuple[Any, torch.Tensor]:
    """A receive into a mapped file, posted (its work and its tensor)."""
    data = torch.frombuffer(view, dtype=torch.uint8)
    return dist.irecv(data, source, group=group, tag=tag), data


def _arrival(memory: str | None, part: str, size: int) -> mmap.mmap | None:
    """A file on its way in, ``size`` bytes, mapped (None where empty): written over the
    pages of a dropped step where the node's memory has one of its name
    (:func:`.snapshotpages.take_pages`)."""
    if not (memory and take_pages(memory, part, os.path.basename(part.removesuffix(_PART)))):
        open(part, "wb").close()
    os.truncate(part, size)  # received whole before it takes its name
    return _mapped(part, size) if size else None


def _mapped(path: str, size: int) -> mmap.mmap:
    """A file of the node's memory mapped whole, its pages mapped at once (one call, not a
    fault for each 4 KiB as the transfer touches them: 512 MiB both ways here 0.32 s, was
    0.43 s)."""
    with open(path, "r+b") as fh:
        return mmap.mmap(fh.fileno(), size, flags=mmap.MAP_SHARED | _POPULATE)


def crc_of(path: str) -> str:
    """A file's CRC-32, as its checksum file holds it (8 hex digits)."""
    crc = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 24):
            crc = zlib.crc32(chunk, crc)  # the GIL is let go for large chunks
    return checksum_text(crc)


def write_checksums(folder: str, names: Sequence[str],
                    sums: Mapping[str, str] | None = None) -> None:
    """The checksum file of each of ``names`` (files this rank wrote in ``folder``), before
    their copies leave (:data:`unirank.statekeep.rules.CHECKSUM`): its sum from ``sums``
    (summed as it was written: :class:`.snapshotread.SummedFiles`), else read from it."""
    for name in names:
        if name == METADATA or name.endswith(CHECKSUM):
            continue
        with contextlib.suppress(OSError):
            target = os.path.join(folder, checksum_of(name))
            known = (sums or {}).get(name)
            with open(target + _PART, "w", encoding="ascii") as fh:
                fh.write(known or crc_of(os.path.join(folder, name)))
            os.replace(target + _PART, target)


def not_matching(folder: str, names: Sequence[str],
                 sums: Mapping[str, str] | None = None) -> list[str]:
    """Those of ``names`` (files that came to ``folder``) whose checksum file is there and
    does not match (a file without one is taken as it came); a file's sum from ``sums``
    (summed from the bytes as they came), else read from it."""
    bad = []
    for name in names:
        if name == METADATA or name.endswith(CHECKSUM):
            continue
        try:
            with open(os.path.join(folder, checksum_of(name)), encoding="ascii") as fh:
                expected = fh.read().strip()
        except OSError:
            continue
        try:
            found = (sums or {}).get(name) or crc_of(os.path.join(folder, name))
        except OSError:
            found = None
        if found != expected:
            bad.append(name)
    return bad


def share_of(gathered: Gathered, moves: Iterable[Transfer], step: int) -> frozenset[str]:
    """What this node is meant to hold of ``step`` once ``moves`` (the copies after a save)
    arrived: the files it held when the ranks gathered (its own ranks'), those sent to it,
    and the metadata."""
    own = gathered.holdings.get(gathered.own_node, {}).get(step)
    coming = {move.name for move in moves if move.target == gathered.own_node}
    return frozenset({*(own.held if own else ()), *coming, METADATA})


def mark_held(memory: str, step: int, share: Iterable[str] | None = None) -> bool:
    """Mark what this node's memory holds of ``step`` (its copies came): :data:`HELD` where it
    holds the metadata and every file of ``share`` (:func:`share_of`; None: every file the
    metadata names), and :data:`WHOLE` too where it holds every file the metadata names (for
    ``unirank run``'s copy to disk at the end: :func:`unirank.statekeep.memory.
    flush_to_disk`); whether it holds the step whole."""
    folder = os.path.join(memory, step_folder(step))
    held = node_step(folder)
    if held.needed is None:
        return False
    names = set(held.held)
    every = held.needed | {METADATA}
    whole = every <= names
    wanted = every if share is None else {*share, METADATA}
    if wanted <= names:
        _mark(folder, HELD, wanted)
    if whole:
        _mark(folder, WHOLE, every)
    return whole


def _mark(folder: str, mark: str, files: Iterable[str]) -> None:
    part = os.path.join(folder, f"{mark}.{os.getpid()}")
    with open(part, "w", encoding="utf-8") as fh:
        json.dump(sorted(files), fh)
    os.replace(part, os.path.join(folder, mark))

