"""A training loop for ``benchmarks/state_recovery.py``: one model parameter of TOTAL MiB,
sharded over the ranks (a DTensor, as FSDP's), updated in place by an optimizer's step each
step of a second and kept with ``ur.save_state`` (default settings). Each event goes to LOG
as a JSON line: the restore (its step, seconds, the bytes the worker read from storage
meanwhile), each step's save time and the time its optimizer's step waited for the save before.

``python _state_worker.py TOTAL_MIB STEPS LOG DISK`` under ``unirank run``.
"""

from __future__ import annotations

import json
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint  # a program that keeps state imports it
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard

import unirank as ur
from unirank.runtime.snapshotstaging import BACKGROUND


def _read_bytes() -> int:
    with open("/proc/self/io") as io:
        return int(next(line for line in io if line.startswith("read_bytes")).split()[1])


def main() -> None:
    total_mib, steps, log, disk = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
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
    restored = ur.load_state(state, folder=disk)
    out(restored=restored, load_s=time.monotonic() - began, read=_read_bytes() - read,
        source=ur.restored_from(), started=started, grouped=grouped)
    for step in range(0 if restored is None else restored + 1, steps):
        began = time.monotonic()
        BACKGROUND.wait_written()  # what the optimizer's step waits for (its pre-step hook)
        waited = time.monotonic() - began
        optimizer.step()
        dist.all_reduce(torch.ones(1))
        state["step"] = step
        stepped, saving = time.time(), time.monotonic()
        ur.save_state(step, state, folder=disk)
        out(step=step, save_s=time.monotonic() - saving, wait_s=waited, stepped=stepped,
            value=float(param.to_local()[0]))  # step + 1 where the state was whole
        time.sleep(max(0.0, 1.0 - (time.monotonic() - began)))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
