"""Benchmark worker: the training loop of ``examples/train.py``, written two ways.

``python -m unirank run -n 2 _train_worker.py auto|hand``: ``auto`` uses ``ur.auto_model``,
``ur.auto_dataloader`` and ``ur.auto_optim``; ``hand`` the same model, data and global batch with
DistributedDataParallel and a DistributedSampler written out. Rank 0 prints ``SAMPLES_PER_S x``,
measured after two warm-up steps (the same steps in both modes). BENCH_EPOCHS (default 2) sets
how many passes over the data it makes.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from train import SmallCNN, random_dataset

import unirank as ur

NB_SAMPLES = 1024
GLOBAL_BATCH = 64
EPOCHS = int(os.environ.get("BENCH_EPOCHS", "2"))
WARMUP = 2


def main(mode: str) -> None:
    dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    torch.manual_seed(0)
    dataset = random_dataset(NB_SAMPLES, 0)
    model: nn.Module
    if mode == "auto":
        loader = ur.auto_dataloader(dataset, batch_size=GLOBAL_BATCH, shuffle=True)
        model = ur.auto_model(SmallCNN())
        optimizer = ur.auto_optim(torch.optim.SGD(model.parameters(), lr=0.01))
    else:
        sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True)
        loader = DataLoader(dataset, batch_size=GLOBAL_BATCH // world, sampler=sampler)
        model = DistributedDataParallel(SmallCNN())
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    criterion = nn.CrossEntropyLoss()
    steps = 0
    start = 0.0
    for epoch in range(EPOCHS):
        if mode == "hand":
            sampler.set_epoch(epoch)
        for data, target in loader:
            if steps == WARMUP:
                dist.barrier()
                start = time.perf_counter()
            optimizer.zero_grad()
            criterion(model(data), target).backward()
            optimizer.step()
            steps += 1
    dist.barrier()
    elapsed = time.perf_counter() - start
    if rank == 0:
        print(f"SAMPLES_PER_S {(steps - WARMUP) * GLOBAL_BATCH / elapsed:.1f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
