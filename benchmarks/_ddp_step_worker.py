"""Benchmark worker: one DDP training step, the first thing a training job does.

A tiny model wrapped in DistributedDataParallel (gloo), AdamW, one forward, backward and
optimizer step. With ``UNIRANK_BENCH_TIMES=<dir>`` each rank writes ``<dir>/<rank>.json`` with
the wall-clock time its first step finished; the harness takes the last rank's, minus the
launch. It then ends at once (``os._exit``): what this measures ends there, and torch's teardown
of a DDP model after the step (``destroy_process_group``, the model's reducer) sometimes hangs
or aborts, under torchrun too, which would only make the figures wait for timeouts.
"""

from __future__ import annotations

import json
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss = model(torch.randn(16, 32)).pow(2).mean()
    loss.backward()
    optimizer.step()
    done = time.time()
    out = os.environ.get("UNIRANK_BENCH_TIMES")
    if out:
        with open(os.path.join(out, f"{dist.get_rank()}.json"), "w") as fh:
            json.dump({"first_step": done}, fh)
    os._exit(0)


if __name__ == "__main__":
    main()
