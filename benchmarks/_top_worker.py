"""Benchmark worker: ``examples/train.py``'s loop (DDP + a DistributedSampler, by hand) for
BENCH_SECONDS (default 40) seconds; rank 0 prints ``SAMPLES_PER_S x`` measured from
BENCH_SKIP (default 12) seconds on, after a ``unirank top`` opened beside it has started and
the ranks' watchers publish their live records (their next tick: at most 5 s).

``python -m unirank run -n 2 _top_worker.py``; every 10 steps the ranks agree to go on (one
all_reduce of rank 0's word), so that they all make the same steps.
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

SECONDS = float(os.environ.get("BENCH_SECONDS", "40"))
SKIP = float(os.environ.get("BENCH_SKIP", "12"))
GLOBAL_BATCH = 64


def main() -> None:
    dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    torch.manual_seed(0)
    dataset = random_dataset(1024, 0)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True)
    loader = DataLoader(dataset, batch_size=GLOBAL_BATCH // world, sampler=sampler)
    model = DistributedDataParallel(SmallCNN())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    criterion = nn.CrossEntropyLoss()
    started = time.perf_counter()
    steps, first, first_at = 0, None, 0.0
    go = torch.ones(1)
    epoch = 0
    while go.item() > 0:
        sampler.set_epoch(epoch)
        epoch += 1
        for data, target in loader:
            optimizer.zero_grad()
            criterion(model(data), target).backward()
            optimizer.step()
            steps += 1
            now = time.perf_counter()
            if first is None and now - started >= SKIP:
                first, first_at = steps, now
            if steps % 10 == 0:
                go.fill_(1.0 if now - started < SECONDS else 0.0)
                dist.broadcast(go, 0)
                if go.item() == 0:
                    break
    elapsed = time.perf_counter() - first_at
    if rank == 0 and first is not None:
        print(f"SAMPLES_PER_S {(steps - first) * GLOBAL_BATCH / elapsed:.1f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
