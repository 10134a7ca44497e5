"""A Lightning Fabric program that knows nothing of unirank: ``Fabric(accelerator="cpu",
strategy="ddp", devices=D, num_nodes=N)`` started by an external launcher, one training step of a
tiny DDP model, then print, as ``FABRIC {json}``, what Fabric reports on this rank, its
``all_reduce`` of 1.0, the gathered ranks and every rank's parameter checksum.

Usage: ``peer_fabric.py [DEVICES [NUM_NODES]]`` (default 2 1). Each rank trains on different data,
so equal checksums mean DDP averaged the gradients. Run by tests/integration/test_peers.py.
Reads (through Fabric): TORCHELASTIC_RUN_ID, RANK, LOCAL_RANK, WORLD_SIZE, GROUP_RANK,
MASTER_ADDR, MASTER_PORT or, inside srun without them, SLURM_*; itself: SLURMD_NODENAME (the
testbed's node, ``-`` outside Slurm).
"""

from __future__ import annotations

import json
import os
import sys

import torch
from lightning_fabric import Fabric

if __name__ == "__main__":
    devices = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    num_nodes = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    fabric = Fabric(accelerator="cpu", strategy="ddp", devices=devices, num_nodes=num_nodes)
    fabric.launch()  # externally launched: joins the group, starts nothing
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = fabric.setup(model, optimizer)
    loss = model(torch.full((2, 2), float(fabric.global_rank))).sum()
    fabric.backward(loss)
    optimizer.step()
    checksum = torch.tensor([sum(float(p.detach().sum()) for p in model.parameters())])
    total = fabric.all_reduce(torch.tensor(1.0), reduce_op="sum")
    gathered = fabric.all_gather(torch.tensor([fabric.global_rank]))
    checksums = fabric.all_gather(checksum)
    record = {
        "rank": fabric.global_rank,
        "world": fabric.world_size,
        "local_rank": fabric.local_rank,
        "node_rank": fabric.node_rank,
        "cluster_environment": type(getattr(fabric.strategy, "cluster_environment", None)).__name__,
        "all_reduce": float(total),
        "gathered": gathered.flatten().tolist(),
        "checksums": checksums.flatten().tolist(),
        "node": os.environ.get("SLURMD_NODENAME", "-"),
    }
    print("FABRIC " + json.dumps(record, sort_keys=True), flush=True)
    # Drop the DDP model (it holds the process group) before destroying the group, so gloo's
    # worker threads are joined while Python is alive (see peer_accelerate.py).
    del model, optimizer, loss
    torch.distributed.destroy_process_group()
