"""Benchmark worker for the elastic scenario: steps of training that say when they ran.

``_elastic_worker.py STEPS``: each rank all-reduces a one per step and prints
``step S rank R world W restart C at T`` (C: TORCHELASTIC_RESTART_COUNT, T: time.time()), then
sleeps 0.1 s. The harness reads node A's lines: the first with C >= 1 is the first step of the
restarted workers.
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
for step in range(int(sys.argv[1])):
    t = torch.ones(1)
    dist.all_reduce(t)
    print(f"step {step} rank {rank} world {world} restart {restart} at {time.time():.3f}",
          flush=True)
    time.sleep(0.1)
dist.destroy_process_group()
