"""One training function written with ``import unirank as ur``, run two ways by
tests/integration/test_ray.py: under ``unirank run -n 2`` (this file as the program) and as a
Ray Train ``TorchTrainer``'s function on a Ray cluster (``--ray ADDRESS``), where Ray starts the
process group before the function runs and ``ur.init()`` must adopt it.

Each rank writes ``OUT/rank<R>.json``: its rank, world, device, launcher, node rank, the master
address (``MASTER_ADDR`` as the launcher set it, and as ``ur.dist_env()`` detected it), whether
the group existed before ``ur.init()``, whether the hang watcher runs, what ``ur.print0`` printed
there, and the final loss (the mean of the ranks' losses, an all_reduce).

Environment variables read: ``MASTER_ADDR`` (recorded as set).

Usage: ray_train.py OUT                    (under unirank run -n 2)
       ray_train.py OUT --ray HOST:PORT    (drives a TorchTrainer of 2 workers, 1 CPU each)
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from pathlib import Path
from typing import Any


def train_fn(config: dict[str, Any]) -> None:
    """The function both runs share."""
    import torch
    import torch.distributed as dist

    import unirank as ur
    from unirank.hang import watcher

    existed = dist.is_available() and dist.is_initialized()
    ur.init()
    rank, world = ur.get_rank(), ur.get_world_size()
    gen = torch.Generator().manual_seed(0)
    inputs, targets = torch.randn(64, 8, generator=gen), torch.randn(64, 1, generator=gen)
    data = torch.utils.data.TensorDataset(inputs, targets)
    loader = ur.auto_dataloader(data, batch_size=16, shuffle=False)
    torch.manual_seed(0)
    model = ur.auto_model(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loss = torch.zeros(())
    for _ in range(5):
        for x, y in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x.to(ur.device())), y.to(ur.device()))
            loss.backward()
            optimizer.step()
    final = ur.all_reduce(float(loss.item())) / world
    env = ur.dist_env()
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        ur.print0(f"FINAL_LOSS {final:.8f}")
    record = {"rank": rank, "world": world, "device": str(ur.device()),
              "launcher": env.launcher, "node_rank": env.node_rank,
              "local_rank": env.local_rank, "local_world_size": env.local_world_size,
              "MASTER_ADDR": os.environ.get("MASTER_ADDR"), "master_addr": env.master_addr,
              "group_existed": existed, "watcher": watcher.running() is not None,
              "printed": printed.getvalue(), "loss": final}
    Path(config["out"], f"rank{rank}.json").write_text(json.dumps(record))
    ur.barrier()


def drive_ray(address: str, out: str) -> None:
    """A TorchTrainer of 2 workers (1 CPU each) on the cluster at ``address``."""
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    ray.init(address=address, log_to_driver=True)
    trainer = TorchTrainer(
        train_fn, train_loop_config={"out": out},
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False,
                                     resources_per_worker={"CPU": 1}),
        run_config=RunConfig(storage_path=out, name="unirank"),
    )
    trainer.fit()
    ray.shutdown()


if __name__ == "__main__":
    if "--ray" in sys.argv:
        drive_ray(sys.argv[sys.argv.index("--ray") + 1], sys.argv[1])
    else:
        train_fn({"out": sys.argv[1]})
