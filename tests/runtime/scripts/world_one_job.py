"""A gloo group of one (``Parallel(backend="gloo")``, in place): auto_model leaves a model
unwrapped and a wrapped one alone; a backend entry's hooks replace auto_model, auto_optim and
the end of auto_dataloader. Prints one ``RESULT {json}`` line.

Usage: python world_one_job.py
"""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import TensorDataset

import unirank as ur
from unirank.runtime import backends

CALLS: list[Any] = []


def wrap_model(model: Any, *, sync_bn: bool, **kwargs: Any) -> Any:
    CALLS.append(["model", type(model).__name__, str(next(model.parameters()).device), sync_bn,
                  sorted(kwargs)])
    return ("hooked model", model)


def wrap_optimizer(optimizer: Any, **kwargs: Any) -> Any:
    CALLS.append(["optimizer", type(optimizer).__name__, sorted(kwargs)])
    return ("hooked optimizer", optimizer)


def wrap_loader(loader: Any) -> Any:
    CALLS.append(["loader", type(loader).__name__, loader.batch_size])
    return ("hooked loader", loader)


def generic() -> dict[str, Any]:
    plain = torch.nn.Linear(2, 2)
    wrapped = DistributedDataParallel(torch.nn.Linear(2, 2))
    return {
        "world": ur.get_world_size(),
        "backend": ur.backend(),
        "plain_same": ur.auto_model(plain) is plain,
        "ddp_same": ur.auto_model(wrapped) is wrapped,
    }


def hooked() -> dict[str, Any]:
    gloo = backends.unregister("gloo")
    backends.register(dataclasses.replace(
        gloo, wrap_model=wrap_model, wrap_optimizer=wrap_optimizer, wrap_loader=wrap_loader))
    try:
        model = ur.auto_model(torch.nn.Linear(2, 2), sync_bn=True, bucket_cap_mb=1)
        optimizer = torch.optim.SGD(model[1].parameters(), lr=0.1)
        optim = ur.auto_optim(optimizer, backward_passes_per_step=2)
        loader = ur.auto_dataloader(TensorDataset(torch.arange(4)), batch_size=2)
    finally:
        backends.unregister("gloo")
        backends.register(gloo)
    return {"hooked": [model[0], optim[0], loader[0]], "calls": CALLS,
            "optim_inner": optim[1] is optimizer}


def body(local_rank: int) -> None:
    result = {**generic(), **hooked()}
    sys.stdout.write("RESULT " + json.dumps(result) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    with ur.Parallel(backend="gloo") as parallel:
        parallel.run(body)
