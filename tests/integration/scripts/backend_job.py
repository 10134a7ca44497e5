"""Runs unirank's collectives and training helpers on one backend; each rank prints one
``RESULT {json}`` line of what it saw.

Usage: python backend_job.py BACKEND [NPROC]   (NPROC: spawn that many workers with Parallel;
without it the job runs as launched: horovodrun, srun, torchrun... or a world of one)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch

import unirank as ur


def checksum(model: torch.nn.Module) -> float:
    return float(sum(p.detach().double().sum().cpu() for p in model.parameters()))


def body(local_rank: int) -> None:
    rank, world = ur.get_rank(), ur.get_world_size()
    result: dict[str, Any] = {
        "rank": rank, "world": world, "local_rank": local_rank,
        "local": [ur.get_local_rank(), ur.get_local_world_size()],
        "backend": ur.backend(), "device": str(ur.device()),
        "sum": ur.all_reduce(rank + 1),
        "mean": ur.all_reduce(rank + 1, "MEAN"),
        "min": ur.all_reduce(rank + 1.5, "min"),
        "max": ur.all_reduce(rank + 1, "MAX"),
        "product": ur.all_reduce(rank + 1, "PRODUCT"),
        "sum_tensor": ur.all_reduce(torch.tensor([rank + 1.0])).tolist(),
        "gather_tensor": ur.all_gather(torch.tensor([rank, 10 * rank])).tolist(),
        "gather_scalar": ur.all_gather(torch.tensor(rank)).tolist(),
        "gather_obj": ur.all_gather({"rank": rank, "t": [rank, "x"]}),
        "bcast_tensor": ur.broadcast(torch.tensor([float(rank)]), src=world - 1).tolist(),
        "bcast_path": str(ur.broadcast(Path(f"/who{rank}"), src=world - 1)),
    }
    if ur.backend() == "horovod":
        import horovod.torch as hvd

        result["hvd"] = [hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(),
                         hvd.cross_rank(), hvd.cross_size()]
    torch.manual_seed(100 + rank)  # different initial weights on every rank
    model = ur.auto_model(torch.nn.Linear(3, 2))
    result["model"] = type(model).__name__
    result["initial"] = ur.all_gather(checksum(model))
    start = [p.detach().cpu().clone() for p in model.parameters()]
    optimizer = ur.auto_optim(torch.optim.SGD(model.parameters(), lr=0.1))
    result["optimizer"] = f"{type(optimizer).__module__}.{type(optimizer).__name__}"
    result["plain_optimizer"] = type(optimizer) is torch.optim.SGD
    optimizer.zero_grad()
    model(torch.full((1, 3), float(rank + 1), device=ur.device())).sum().backward()
    optimizer.step()
    # dL/dW = x = rank + 1 and dL/db = 1 on each rank: the averaged step is the same everywhere
    result["step"] = [(p.detach().cpu() - s).flatten().tolist()
                      for p, s in zip(model.parameters(), start)]
    result["after"] = ur.all_gather(checksum(model))
    dataset = torch.utils.data.TensorDataset(torch.arange(4 * world))
    loader = ur.auto_dataloader(dataset, batch_size=2 * world, shuffle=False)
    result["shard"] = [int(v) for (batch,) in loader for v in batch]
    ur.barrier()
    sys.stdout.write("RESULT " + json.dumps(result) + "\n")  # one write: lines stay whole
    sys.stdout.flush()


if __name__ == "__main__":
    nproc = int(sys.argv[2]) if len(sys.argv) > 2 else None
    with ur.Parallel(backend=sys.argv[1], nproc_per_node=nproc) as parallel:
        parallel.run(body)
