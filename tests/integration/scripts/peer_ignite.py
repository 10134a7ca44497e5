"""A pytorch-ignite program that knows nothing of unirank: print, as ``IGNITE {json}``, what
``ignite.distributed`` reports on this rank and the result of its ``all_reduce`` of 1.0.

Run by tests/integration/test_peers.py under ``unirank run`` and srun. Reads (through ignite):
RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT and, inside Slurm, SLURM_JOB_ID,
SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS, SLURM_JOB_NODELIST, SLURM_JOB_NUM_NODES; itself:
SLURMD_NODENAME (the testbed's node, ``-`` outside Slurm).
"""

from __future__ import annotations

import json
import os

import ignite.distributed as idist
import torch


def fn(local_rank: int) -> None:
    total = idist.all_reduce(torch.tensor(1.0))
    record = {
        "rank": idist.get_rank(),
        "world": idist.get_world_size(),
        "local_rank": idist.get_local_rank(),
        "fn_local_rank": local_rank,
        "nnodes": idist.get_nnodes(),
        "node_rank": idist.get_node_rank(),
        "nproc_per_node": idist.get_nproc_per_node(),
        "backend": idist.backend(),
        "all_reduce": float(total),
        "node": os.environ.get("SLURMD_NODENAME", "-"),
        "master": f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}",
    }
    print("IGNITE " + json.dumps(record, sort_keys=True), flush=True)


if __name__ == "__main__":
    with idist.Parallel(backend="gloo") as parallel:
        parallel.run(fn)
