"""Steps of training for the elastic tests: ``elastic_steps.py STEPS FIFO``.

Each rank all-reduces a one per step and prints ``step S rank R world W sum N restart C``
(C: TORCHELASTIC_RESTART_COUNT); in the first attempt, rank 2 (the second node's first rank)
writes ``ready`` to the FIFO after step 1, so that the test knows a world of two nodes trains.
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
    if step == 1 and rank == 2 and restart == "0":
        with open(sys.argv[2], "w") as fifo:
            fifo.write("ready")
    time.sleep(0.2)
dist.destroy_process_group()
