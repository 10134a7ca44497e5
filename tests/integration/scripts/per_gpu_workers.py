"""One launched task per node spawns one worker per GPU it got: ``Parallel(nproc_per_node=G)``.

``G`` is the number of devices in ``CUDA_VISIBLE_DEVICES`` (``srun --gres=gpu:2`` gives ``0,1``;
the testbed's GPUs are fake, so the workers use gloo on the CPU). Every worker all-reduces a
tensor of ones and prints ``WORKER {json}`` with its rank, world, node, master, the sum, and the
device unirank would give it if CUDA were behind the fake GPUs (:func:`planned_device`).

Reads: CUDA_VISIBLE_DEVICES and whatever :class:`unirank.Parallel` reads.
"""

from __future__ import annotations

import json
import os
import sys

import torch

import unirank as ur
from unirank.gpus import planned_device, visible_gpu_count


def body(local_rank: int) -> None:
    data = torch.ones(1)
    ur.all_reduce(data)
    env = ur.dist_env()
    record = {
        "rank": ur.get_rank(),
        "world": ur.get_world_size(),
        "local_rank": local_rank,
        "local_world_size": ur.get_local_world_size(),
        "node_rank": ur.get_node_rank(),
        "node": ur.hostname(),
        "master_addr": env.master_addr,
        "master_port": env.master_port,
        "sum": float(data.item()),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "planned_device": planned_device(os.environ, local_rank),
    }
    sys.stdout.write("WORKER " + json.dumps(record) + "\n")
    sys.stdout.flush()
    ur.barrier()


if __name__ == "__main__":
    gpus = visible_gpu_count(os.environ)
    if gpus < 1:
        sys.exit(f"per_gpu_workers.py: no GPU bound (CUDA_VISIBLE_DEVICES="
                 f"{os.environ.get('CUDA_VISIBLE_DEVICES')!r}); use srun --gres=gpu:N")
    with ur.Parallel(backend="gloo", nproc_per_node=gpus) as parallel:
        parallel.run(body)
