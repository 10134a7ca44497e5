"""ignite's idist calls on unirank's Horovod backend: ``idist.spawn("horovod", ..., 2)``; each
rank prints one ``RESULT {json}`` line. Objects of different types on different ranks (``None``
on the others) are the case Horovod's default op names would hang on."""

from __future__ import annotations

import json

import torch

import unirank as idist


def body(local_rank: int) -> None:
    rank = idist.get_rank()
    try:
        idist.new_group([0])
        new_group = "made"
    except ValueError as exc:
        new_group = str(exc)
    result = {
        "rank": rank,
        "model_name": idist.model_name(),
        "bcast_obj": idist.broadcast("x" if rank == 0 else None, 0, True),
        "bcast_safe": idist.broadcast(torch.arange(3) if rank == 0 else None, 0, True).tolist(),
        "gather_mixed": idist.all_gather(None if rank else {"r": 0}),
        "shapes": [list(t.shape) for t in idist.all_gather_tensors_with_shapes(
            torch.ones(rank + 1, 2), [[1, 2], [2, 2]])],
        "new_group": new_group,
    }
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    idist.spawn("horovod", body, (), nproc_per_node=2)
