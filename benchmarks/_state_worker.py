"""A training loop for ``benchmarks/state_recovery.py``: one model parameter of TOTAL MiB,
sharded over the ranks (a DTensor, as FSDP's), updated in place by an optimizer's step each
step of a second and kept every step by MODE: ``unirank`` (``ur.save_state`` /
``ur.load_state``, default settings), ``dcp`` (torch's ``dcp.save`` to DISK/step-N, the
newest complete step loaded with ``dcp.load``), ``dcp-async`` (``dcp.async_save`` over a
group of its own, the last one waited for before the next, as torch's docs show). Each event
goes to LOG as a JSON line: the restore (its step, seconds, the bytes the worker read from
storage meanwhile), each step's save time and the time its optimizer's step waited for the
save before.

``python _state_worker.py TOTAL_MIB STEPS LOG DISK [MODE]`` under ``unirank run``.
"""

from __future__ import annotations

import json
import os
import sys
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
    local = torch.zeros(total_mib * (1 << 20) // 4 // world)
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
            value=float(param.to_local()[0]))  # step + 1 where the state was whole
        time.sleep(max(0.0, 1.0 - (time.monotonic() - began)))
    saver.close()
    dist.destroy_process_group()


class Saver:
    """How the loop keeps its state (the module's MODE)."""

    def __init__(self, mode: str, disk: str) -> None:
        self.mode, self.disk = mode, disk
        self.pending: Any = None
        self.loaded: int | None = None
        # an async save's collectives run in its thread: a group of their own, else they
        # interleave with the loop's on the default group (a mismatch: both wait forever)
        self.group = dist.new_group(backend="gloo") if mode == "dcp-async" else None

    def _folder(self, step: int) -> str:
        return os.path.join(self.disk, f"step-{step}")

    def save(self, step: int, state: dict[str, Any]) -> None:
        if self.mode == "unirank":
            ur.save_state(step, state, folder=self.disk)
        elif self.mode == "dcp":
            dcp.save(state, checkpoint_id=self._folder(step))
        else:
            if self.pending is not None:
                self.pending.result()
            self.pending = dcp.async_save(state, checkpoint_id=self._folder(step),
                                          process_group=self.group)

    def load(self, state: dict[str, Any]) -> int | None:
        if self.mode == "unirank":
            return ur.load_state(state, folder=self.disk)
        done = sorted(int(name.split("-")[1]) for name in os.listdir(self.disk)
                      if os.path.exists(os.path.join(self.disk, name, ".metadata"))) \
            if os.path.isdir(self.disk) else []
        if not done:
            return None
        dcp.load(state, checkpoint_id=self._folder(done[-1]))
        self.loaded = done[-1]
        return self.loaded

    def source(self) -> str | None:
        if self.mode == "unirank":
            return ur.restored_from()
        return None if self.loaded is None else f"step {self.loaded} from the disk folder"

    def close(self) -> None:
        if self.pending is not None:
            self.pending.result()


if __name__ == "__main__":
    main()
