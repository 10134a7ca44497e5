"""Spawns 2 gloo workers with Parallel; each checks auto_model, auto_optim, manual_seed, save and
load and prints one ``RESULT {json}`` line of what it saw.

Usage: python training_job.py DIR   (DIR: an empty folder for the checkpoint)
"""

from __future__ import annotations

import copy
import json
import os
import random
import sys
from typing import Any

import numpy
import torch

import unirank as ur
from unirank.errors import ConfigError


def seeds(rank: int) -> dict[str, Any]:
    shared = ur.manual_seed(5)
    draws = [random.random(), float(numpy.random.rand()), torch.rand(1).item()]
    own = ur.manual_seed(5, per_rank=True)
    return {"shared_seed": shared, "shared_draws": draws, "own_seed": own,
            "own_draw": torch.rand(1).item()}


def model_step(rank: int) -> dict[str, Any]:
    torch.manual_seed(100 + rank)  # different initial weights on each rank
    plain = torch.nn.Linear(4, 1)
    model = ur.auto_model(plain)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    # different data on each rank; the gradient this rank's data alone gives
    data = torch.arange(32, dtype=torch.float32).reshape(8, 4) * (rank + 1)
    target = torch.full((8, 1), float(rank))
    alone = copy.deepcopy(plain)
    torch.nn.functional.mse_loss(alone(data), target).backward()
    torch.nn.functional.mse_loss(model(data), target).backward()
    grads = [p.grad.flatten().tolist() for p in plain.parameters()]  # type: ignore[union-attr]
    alone_grads = [p.grad.flatten().tolist() for p in alone.parameters()]  # type: ignore[union-attr]
    start = [p.detach().flatten().tolist() for p in alone.parameters()]
    optimizer.step()
    try:
        ur.auto_model(torch.nn.BatchNorm1d(3), sync_bn=True)
        sync_bn = None
    except ConfigError as exc:
        sync_bn = str(exc)
    return {
        "wrapped": type(model).__name__,
        "module_is_plain": getattr(model, "module", None) is plain,
        "not_rewrapped": ur.auto_model(model) is model,
        "optim_unchanged": ur.auto_optim(optimizer) is optimizer,
        "start": start,
        "grads": grads,
        "alone_grads": alone_grads,
        "after_step": [p.detach().flatten().tolist() for p in model.parameters()],
        "sync_bn": sync_bn,
    }


def checkpoint(rank: int, folder: str) -> dict[str, Any]:
    path = os.path.join(folder, "ckpt.pt")
    ur.save({"from": rank, "tensor": torch.full((2,), float(rank))}, path)
    # every rank reads right after the call: the file must be there
    loaded = ur.load(path)
    files = sorted(os.listdir(folder))
    try:
        ur.save({"from": rank}, os.path.join(folder, "no-such-folder", "ckpt.pt"))
        failure = None
    except Exception as exc:
        failure = f"{type(exc).__name__}: {exc}"
    return {"loaded_from": loaded["from"], "loaded_tensor": loaded["tensor"].tolist(),
            "loaded_device": str(loaded["tensor"].device), "files": files, "failure": failure}


def body(local_rank: int, folder: str) -> None:
    rank = ur.get_rank()
    result = {"rank": rank, **seeds(rank), **model_step(rank), **checkpoint(rank, folder)}
    ur.barrier()
    sys.stdout.write("RESULT " + json.dumps(result) + "\n")  # one write: lines stay whole
    sys.stdout.flush()


if __name__ == "__main__":
    with ur.Parallel(backend="gloo", nproc_per_node=2) as parallel:
        parallel.run(body, sys.argv[1])
