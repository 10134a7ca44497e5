"""A training loop for ``benchmarks/state_recovery.py``: one model parameter of TOTAL MiB,
sharded over the ranks (a DTensor, as FSDP's), updated in place by an optimizer's step each
step of a second and kept every step by MODE: ``unirank`` (``ur.save_state`` /
``ur.load_state``, default settings), ``dcp`` (torch's ``dcp.save`` to DISK/step-N, the
newest complete step loaded with ``dcp.load``), ``dcp-async`` (``dcp.async_save`` over a
group of its own, the last one waited for before the next, as torch's docs show),
``memory-only`` (a node-memory tier as DLRover's flash checkpoint keeps one: ``dcp.save`` into
the node's own memory, the folder ``BENCH_NODE_MEMORY``, then a thread persists the step's files
to DISK/step-N; no copy on another node, so a restore after a lost node reads what it lacks from
the disk: the newest step persisted whole, each file from the node's memory where it is there,
else from the disk). Each event
goes to LOG as a JSON line: the restore (its step, seconds, the bytes the worker read from
storage meanwhile), each step's save time and the time its optimizer's step waited for the
save before.

``python _state_worker.py TOTAL_MIB STEPS LOG DISK [MODE]`` under ``unirank run``.

Environment variables read: BENCH_NODE_MEMORY (``memory-only``).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import threading
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp  # a program that keeps state imports it
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard

import unirank as ur
from unirank.runtime.snapshotstaging import BACKGROUND


def _read_bytes() -> int:
    with open("/proc/self/io") as io:
        return int(next(line for line in io if line.startswith("read_bytes")).split()[1])


def main() -> None:
    total_mib, steps, log, disk = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    mode = sys.argv[5] if len(sys.argv) > 5 else "unirank"
    started = time.time()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    grouped = time.time()
    mesh = init_device_mesh("cpu", (world,))
    # the same global size at any world size up to 3 (a multiple of 6 elements)
    local = torch.zeros(total_mib * (1 << 20) // 4 // 6 * 6 // world)
    param = torch.nn.Parameter(DTensor.from_local(local, mesh, [Shard(0)], run_check=False))
    param.grad = DTensor.from_local(torch.full_like(local, -1.0), mesh, [Shard(0)],
                                    run_check=False)
    optimizer = torch.optim.SGD([param], lr=1.0)  # each step adds 1 (in place, as any step)
    state = {"w": param, "step": -1}

    def out(**fields: object) -> None:
        with open(log, "a") as fh:
            fh.write(json.dumps({"rank": rank, "world": world, "time": time.time(), **fields})
                     + "\n")

    read, began = _read_bytes(), time.monotonic()
    saver = Saver(mode, disk)
    restored = saver.load(state)
    out(restored=restored, load_s=time.monotonic() - began, read=_read_bytes() - read,
        source=saver.source(), started=started, grouped=grouped)
    for step in range(0 if restored is None else restored + 1, steps):
        began = time.monotonic()
        BACKGROUND.wait_written()  # what the optimizer's step waits for (its pre-step hook)
        waited = time.monotonic() - began
        optimizer.step()
        dist.all_reduce(torch.ones(1))
        state["step"] = step
        stepped, saving = time.time(), time.monotonic()
        saver.save(step, state)
        out(step=step, save_s=time.monotonic() - saving, wait_s=waited, stepped=stepped,
            value=float(param.to_local()[0].detach()))  # step + 1 where the state was whole
        time.sleep(max(0.0, 1.0 - (time.monotonic() - began)))
    saver.close()
    dist.destroy_process_group()


class Saver:
    """How the loop keeps its state (the module's MODE)."""

    def __init__(self, mode: str, disk: str) -> None:
        self.mode, self.disk = mode, disk
        self.pending: Any = None
        self.loaded: int | None = None
        self.mixed = (0, 0)  # memory-only: files read from the node's memory, from the disk
        # an async save's collectives run in its thread: a group of their own, else they
        # interleave with the loop's on the default group (a mismatch: both wait forever)
        self.group = dist.new_group(backend="gloo") if mode == "dcp-async" else None

    def _folder(self, step: int) -> str:
        return os.path.join(self.disk, f"step-{step}")

    def save(self, step: int, state: dict[str, Any]) -> None:
        if self.mode == "unirank":
            ur.save_state(step, state, folder=self.disk)
        elif self.mode == "memory-only":
            self._save_in_memory(step, state)
        elif self.mode == "dcp":
            dcp.save(state, checkpoint_id=self._folder(step))
        else:
            if self.pending is not None:
                self.pending.result()
            self.pending = dcp.async_save(state, checkpoint_id=self._folder(step),
                                          process_group=self.group)

    def _save_in_memory(self, step: int, state: dict[str, Any]) -> None:
        """``memory-only``: the step into this node's memory, then persisted by a thread (the
        one before waited for first); the metadata goes last, so a step on disk is whole."""
        if self.pending is not None:
            self.pending.join()
        memory = os.path.join(os.environ["BENCH_NODE_MEMORY"], f"step-{step}")
        dcp.save(state, checkpoint_id=memory)
        mark = f".persisted-{dist.get_rank()}-of-{dist.get_world_size()}"
        self.pending = threading.Thread(target=_persist,
                                        args=(memory, self._folder(step), mark))
        self.pending.start()

    def load(self, state: dict[str, Any]) -> int | None:
        if self.mode == "unirank":
            return ur.load_state(state, folder=self.disk)
        done = sorted(int(name.split("-")[1]) for name in os.listdir(self.disk)
                      if _whole(os.path.join(self.disk, name), self.mode)) \
            if os.path.isdir(self.disk) else []
        if not done:
            return None
        if self.mode == "memory-only":
            with tempfile.TemporaryDirectory() as view:
                memory = os.path.join(os.environ["BENCH_NODE_MEMORY"], f"step-{done[-1]}")
                self.mixed = _link_view(view, memory, self._folder(done[-1]))
                dcp.load(state, checkpoint_id=view)
        else:
            dcp.load(state, checkpoint_id=self._folder(done[-1]))
        self.loaded = done[-1]
        return self.loaded

    def source(self) -> str | None:
        if self.mode == "unirank":
            return ur.restored_from()
        if self.loaded is None:
            return None
        if self.mode == "memory-only":
            return (f"step {self.loaded}: {self.mixed[0]} files from the node's memory, "
                    f"{self.mixed[1]} from the disk folder")
        return f"step {self.loaded} from the disk folder"

    def close(self) -> None:
        if isinstance(self.pending, threading.Thread):
            self.pending.join()
        elif self.pending is not None:
            self.pending.result()


def _persist(memory: str, disk: str, mark: str) -> None:
    """A step's files from this node's memory to the disk folder, then this rank's ``mark``."""
    os.makedirs(disk, exist_ok=True)
    for name in os.listdir(memory):
        shutil.copyfile(os.path.join(memory, name), os.path.join(disk, name + ".part"))
        os.replace(os.path.join(disk, name + ".part"), os.path.join(disk, name))
    open(os.path.join(disk, mark), "w").close()


def _whole(folder: str, mode: str) -> bool:
    """Whether a step's folder holds the whole step: its metadata, and for ``memory-only``
    every rank's mark of its files persisted."""
    if not os.path.exists(os.path.join(folder, ".metadata")):
        return False
    if mode != "memory-only":
        return True
    marks = [name for name in os.listdir(folder) if name.startswith(".persisted-")]
    return bool(marks) and len(marks) == int(marks[0].rsplit("-", 1)[1])


def _link_view(view: str, memory: str, disk: str) -> tuple[int, int]:
    """A folder holding the step's files: each from this node's memory where it is there, else
    from the disk; how many of each."""
    counts = [0, 0]
    for name in os.listdir(disk):
        if name.endswith(".part") or name.startswith(".persisted-"):
            continue
        local = os.path.join(memory, name)
        here = os.path.exists(local)
        counts[0 if here else 1] += 1
        os.symlink(local if here else os.path.join(disk, name), os.path.join(view, name))
    return counts[0], counts[1]


if __name__ == "__main__":
    main()
