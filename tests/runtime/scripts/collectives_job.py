"""Spawns N gloo workers with Parallel; each prints one ``RESULT {json}`` line of what it saw.

Usage: python collectives_job.py N DIR   (DIR: an empty folder for the one_rank_first check)
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import torch
from shared_types import Point

import unirank as ur

ENV_NAMES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
             "GROUP_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS",
             "TORCHELASTIC_USE_AGENT_STORE")


def body(local_rank: int, folder: str) -> None:
    rank = ur.get_rank()
    with ur.one_rank_first():
        seen_first = sorted(os.listdir(folder))
        open(os.path.join(folder, str(rank)), "w").close()
    summed = ur.all_reduce(torch.tensor([rank + 1.0]))
    result = {
        "local_rank": local_rank,
        "rank": rank,
        "world": ur.get_world_size(),
        "local": [ur.get_local_rank(), ur.get_local_world_size()],
        "node": [ur.get_node_rank(), ur.get_nnodes()],
        "backend": ur.backend(),
        "device": str(ur.device()),
        "env": {name: os.environ.get(name) for name in ENV_NAMES},
        "sum_tensor": summed.tolist(),
        "sum": ur.all_reduce(rank + 1),
        "mean": ur.all_reduce(rank + 1, "MEAN"),
        "min": ur.all_reduce(rank + 1.5, "min"),
        "max": ur.all_reduce(rank + 1, "MAX"),
        "product": ur.all_reduce(rank + 1, "PRODUCT"),
        "mean_tensor": ur.all_reduce(torch.tensor([float(rank)]), "MEAN").tolist(),
        "gather_tensor": ur.all_gather(torch.tensor([rank, 10 * rank])).tolist(),
        "gather_scalar": ur.all_gather(torch.tensor(rank)).tolist(),
        "gather_number": ur.all_gather(rank * 0.5),
        "gather_str": ur.all_gather(f"r{rank}"),
        "gather_obj": ur.all_gather({"rank": rank, "tuple": [rank, "x"]}),
        "bcast_tensor": ur.broadcast(torch.tensor([float(rank)]), src=1).tolist(),
        "bcast_number": ur.broadcast(rank * 7, src=1),
        "bcast_str": ur.broadcast(f"from {rank}", src=1),
        "bcast_path": str(ur.broadcast(Path(f"/who{rank}"), src=1)),
        "bcast_dict": ur.broadcast({"from": rank, "list": [rank, (rank,)]}, src=1),
        "bcast_dict_safe": ur.broadcast({"from": rank} if rank == 2 else None, src=2,
                                        safe_mode=True),
        "bcast_obj": dataclasses.asdict(ur.broadcast(Point(rank, f"p{rank}"), src=2)),
        "only_zero": ur.one_rank_only()(lambda: "ran")(),
        "seen_first": seen_first,
    }
    ur.print0("PRINT0 once")
    ur.get_logger("unirank.job").info("logged")
    ur.barrier()
    sys.stdout.write("RESULT " + json.dumps(result) + "\n")  # one write: lines stay whole
    sys.stdout.flush()


if __name__ == "__main__":
    with ur.Parallel(backend="gloo", nproc_per_node=int(sys.argv[1])) as parallel:
        parallel.run(body, sys.argv[2])
