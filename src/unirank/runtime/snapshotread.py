"""DCP's file system storage, as the node's memory tier writes and reads it.

The memory tier writes one file per item (``single_file_per_rank=False``): each tensor is then
a whole ``torch.save`` file in ``/dev/shm``, which :class:`MemoryReader` maps (``torch.load``
with ``mmap=True``) and copies once into the program's tensor; DCP's own reader reads each
tensor out of a shared file into a new tensor first (two copies and a read: five to six times
slower for 512 MiB here). Any other item (bytes, a slice of a shared file, a transformed one)
goes to DCP's reader.

Reads: nothing from the environment.
"""

from __future__ import annotations

import contextlib
import os
import zlib
from collections.abc import Generator, Iterator, Sequence
from dataclasses import replace
from typing import Any

import torch
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint.filesystem import (
    FileSystem,
    FileSystemReader,
    FileSystemWriter,
)
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner
from torch.futures import Future

from unirank.runtime.boundworld import release_bound_world
from unirank.runtime.snapshotpages import take_pages
from unirank.statekeep.rules import checksum_text

# DCP's import, just above, may have bound the program's group for good (:mod:`.boundworld`);
# every save and restore of unirank imports this module
release_bound_world()

__all__ = ["MemoryReader", "MemoryWriter", "SummedFiles", "files_to_read", "memory_writer",
           "plain_layout", "plain_shard_layouts", "without_checksums"]


class _Summed:
    """A file being written and the CRC-32 of every byte written to it so far (DCP's writer
    writes each file front to back; torch.save writes to a stream it cannot seek)."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw
        self.crc = 0
        self.size = 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        written = int(self.raw.write(view))  # a buffered file takes every byte
        self.crc = zlib.crc32(view, self.crc)  # the GIL is let go for large buffers
        self.size += written
        return written

    def __getattr__(self, name: str) -> Any:  # tell, flush, fileno, close
        return getattr(self.raw, name)


class SummedFiles(FileSystem):
    """DCP's file system for a node's memory ``tier``: each file written over a waiting one
    of the tier's pages where one has its name (:mod:`.snapshotpages`), and its CRC-32 kept
    (``sums``, by name), summed from the bytes as they pass to the file, not read back (half
    the checksum's cost)."""

    def __init__(self, tier: str) -> None:
        super().__init__()
        self.tier = tier
        self.sums: dict[str, str] = {}

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str
                      ) -> Generator[Any, None, None]:
        if mode != "wb":
            with super().create_stream(path, mode) as other:
                yield other
            return
        name = os.fspath(path)
        over = take_pages(self.tier, name)
        with open(name, "r+b" if over else "wb") as raw:
            summed = _Summed(raw)
            yield summed  # DCP's writer closes it before it gives it back
        if over:  # what is left of the old file past the new end
            os.truncate(name, summed.size)
        self.sums[os.path.basename(name)] = checksum_text(summed.crc)


class MemoryWriter(FileSystemWriter):
    """DCP's writer for the node's memory: one file per item, over the pages of a dropped
    step where it can (:class:`SummedFiles`); ``written``: the names of the
    files this rank wrote, ``sums``: their CRC-32s, summed as they were written (for
    :func:`.snapshotcopies.write_checksums`)."""

    def __init__(self, path: str) -> None:
        super().__init__(path, single_file_per_rank=False)
        self.files = SummedFiles(os.path.dirname(os.path.abspath(path)))
        self.fs = self.files
        self.written: list[str] = []

    @property
    def sums(self) -> dict[str, str]:
        return {name: self.files.sums[name] for name in self.written if name in self.files.sums}

    def write_data(self, plan: Any, planner: Any) -> Future[list[Any]]:
        done: Future[list[Any]] = super().write_data(plan, planner)
        done.wait()
        self.written = sorted({result.storage_data.relative_path for result in done.value()})
        return done


def memory_writer(path: str) -> MemoryWriter:
    """DCP's writer for the node's memory (:class:`MemoryWriter`)."""
    return MemoryWriter(path)


@contextlib.contextmanager
def without_checksums() -> Iterator[None]:
    """``torch.save`` without its CRC-32 of each record, while the memory tier writes: half the
    time of a write (512 MiB: 0.25 s against 0.13 s here), and ``torch.load`` (DCP's reader,
    :class:`MemoryReader`) never checks it. torch's switch is the process's: a ``torch.save``
    of the program's own thread meanwhile writes no CRC either (``torch.load`` reads it as
    any; only a zip tool's test of its records would fail)."""
    from torch.utils import serialization

    with serialization.config.patch({"save.compute_crc32": False}):  # type: ignore[attr-defined]
        yield


def plain_layout(global_shape: Sequence[int], mesh_shape: Sequence[int],
                 coordinate: Sequence[int], placements: Sequence[Any]
                 ) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """A DTensor's local shape and global offset where every placement is a plain ``Shard``,
    ``Replicate`` or ``Partial`` (None for any other, a ``_StridedShard``): torch's own rule
    (``Shard._local_shard_size_and_offset``, mesh dimensions left to right, an empty shard at
    the dimension's end), with integers where torch 2.13 builds an index tensor as long as the
    shard (an ``arange`` of 1 GiB of int64 for 512 MiB of float32: 0.37 s at every save, and
    0.4 s of a restore, here)."""
    from torch.distributed.tensor.placement_types import Partial, Replicate, Shard

    if any(type(p) is not Shard and not isinstance(p, Replicate | Partial) for p in placements):
        return None
    local, offset = list(global_shape), [0] * len(global_shape)
    for mesh_dim, placement in enumerate(placements):
        if type(placement) is not Shard:
            continue
        dim = placement.dim
        size, start = placement._local_shard_size_and_offset(  # torch 2.9 to 2.13 alike
            local[dim], mesh_shape[mesh_dim], coordinate[mesh_dim])
        if size == 0:  # torch: an empty shard starts at the dimension's end
            offset[dim] = global_shape[dim]
        else:
            offset[dim] += int(start)
        local[dim] = size
    return tuple(local), tuple(offset)


@contextlib.contextmanager
def plain_shard_layouts() -> Iterator[None]:
    """DCP's planner (a save's, a restore's) with :func:`plain_layout` for DTensors whose
    placements allow it, torch's rule for the others: the planner's name is pointed at it
    while DCP plans (a ``dcp`` call of the program's own meanwhile gets the same answers)."""
    from torch.distributed.checkpoint import planner_helpers

    compute = planner_helpers.compute_local_shape_and_global_offset  # type: ignore[attr-defined]

    def layout(global_shape: Any, mesh: Any, placements: Any,
               skip_offset: bool = False) -> tuple[tuple[int, ...], tuple[int, ...]]:
        coordinate = mesh.get_coordinate()
        found = None if skip_offset or coordinate is None else plain_layout(
            tuple(global_shape), tuple(mesh.shape), coordinate, tuple(placements))
        if found is None:
            return compute(global_shape, mesh, placements, skip_offset=skip_offset)
        return found

    planner_helpers.compute_local_shape_and_global_offset = layout  # type: ignore[attr-defined]
    try:
        yield
    finally:
        planner_helpers.compute_local_shape_and_global_offset = compute  # type: ignore[attr-defined]


def files_to_read(obj: dict[str, Any], metadata_path: str) -> frozenset[str] | None:
    """The files of a step (its ``.metadata`` at ``metadata_path``) that DCP's default load
    plan of ``obj`` reads on this rank (its own shards, every replicated value); None where
    that plan cannot be made (DCP's load then says why)."""
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    try:
        metadata = FileSystemReader(os.path.dirname(metadata_path)).read_metadata()
        planner = DefaultLoadPlanner()
        with plain_shard_layouts():
            planner.set_up_planner(obj, metadata, is_coordinator=False)
            plan = planner.create_local_plan()
        return frozenset(metadata.storage_data[item.storage_index].relative_path
                         for item in plan.items)
    except Exception:  # any failure to plan: the restore sends every file, as before
        return None


class MemoryReader(FileSystemReader):
    """DCP's reader, with a tensor that fills a whole file of its own mapped, not read."""

    def _whole_file(self, req: Any) -> str | None:
        info = self.storage_data[req.storage_index]
        if req.type != LoadItemType.TENSOR or info.offset != 0 or info.transform_descriptors:
            return None
        path = os.path.join(str(self.path), info.relative_path)
        try:
            return path if os.path.getsize(path) == info.length else None
        except OSError:
            return None

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        rest = []
        for req in plan.items:
            path = self._whole_file(req)
            if path is None:
                rest.append(req)
                continue
            saved = torch.load(path, mmap=True, map_location="cpu", weights_only=True)
            saved = narrow_tensor_by_index(saved, req.storage_offsets, req.lengths)
            target = planner.resolve_tensor(req).detach()
            if target.size() != saved.size():
                raise AssertionError(f"req {req.storage_index} mismatch sizes "
                                     f"{target.size()} vs {saved.size()}")
            target.copy_(saved)
            planner.commit_tensor(req, target)
        if rest:
            return super().read_data(replace(plan, items=rest), planner)
        done: Future[None] = Future()
        done.set_result(None)
        return done
