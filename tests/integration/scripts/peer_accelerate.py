"""An HF Accelerate program that knows nothing of unirank: prepare a tiny model, optimizer and
DataLoader, take one training step, gather every rank's ``process_index`` and a checksum of the
parameters, and print, as ``ACCELERATE {json}``, what the Accelerator reports on this rank.

Each rank trains on a different shard, so equal checksums on all ranks mean DDP averaged the
gradients. Run by tests/integration/test_peers.py. Reads (through Accelerate): RANK, LOCAL_RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT (and Accelerate's own ACCELERATE_* variables); itself:
SLURMD_NODENAME (the testbed's node, ``-`` outside Slurm).
"""

from __future__ import annotations

import json
import os

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

SAMPLES, BATCH = 16, 2

if __name__ == "__main__":
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)  # the same initial weights everywhere (DDP also broadcasts rank 0's)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = TensorDataset(torch.arange(2.0 * SAMPLES).reshape(SAMPLES, 2), torch.ones(SAMPLES, 1))
    loader = DataLoader(data, batch_size=BATCH)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    x, y = next(iter(loader))
    loss = torch.nn.functional.mse_loss(model(x), y)
    accelerator.backward(loss)
    optimizer.step()
    checksum = torch.tensor([sum(float(p.detach().sum()) for p in model.parameters())])
    gathered = accelerator.gather(torch.tensor([accelerator.process_index]))
    checksums = accelerator.gather(checksum)
    record = {
        "process_index": accelerator.process_index,
        "num_processes": accelerator.num_processes,
        "local_process_index": accelerator.local_process_index,
        "distributed_type": str(accelerator.distributed_type),
        "device": str(accelerator.device),
        "gathered": gathered.tolist(),
        "checksums": checksums.tolist(),
        "batches": len(loader),
        "node": os.environ.get("SLURMD_NODENAME", "-"),
    }
    print("ACCELERATE " + json.dumps(record, sort_keys=True), flush=True)
    # Drop the DDP model (it holds the process group) before end_training() destroys the group,
    # so gloo's worker threads are joined while Python is alive. Otherwise about one run in 20
    # aborts at exit ("terminate called without an active exception", SIGABRT) under torchrun and
    # unirank run alike: a gloo thread frees a gather's tensor during interpreter finalization
    # (torch 2.13; pytorch/pytorch#190489).
    del model, optimizer, loader, loss, x, y
    accelerator.free_memory()
    accelerator.end_training()
