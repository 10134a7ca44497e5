"""Steps of training for the elastic tests: ``elastic_steps.py STEPS``.

Each rank all-reduces a one per step and prints ``step S rank R world W sum N restart C``
(C: TORCHELASTIC_RESTART_COUNT), then sleeps 0.2 s.
"""

import os
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
for step in range(int(sys.argv[1])):
    t = torch.ones(1)
    dist.all_reduce(t)
    print(f"step {step} rank {rank} world {world} sum {int(t.item())} restart {restart}",
          flush=True)
    time.sleep(0.2)
dist.destroy_process_group()
