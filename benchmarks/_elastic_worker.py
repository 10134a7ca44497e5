"""Benchmark worker for the elastic scenario: steps of training that say when they ran.

``_elastic_worker.py STEPS``: each rank all-reduces a one per step and prints
``step S rank R world W restart C at T`` (C: TORCHELASTIC_RESTART_COUNT, T: time.time()), then
sleeps 0.1 s. With BENCH_STUCK_AT=N in its environment, a rank sleeps forever in user code
before its step N (saying ``stuck at T`` first); with BENCH_STUCK_HOW=stop too, it stops
itself with SIGSTOP there instead (a debugger, a job control's Ctrl-Z); with
BENCH_STUCK_HOW=dstate, it waits in D state (the parent of a vfork'ed child that sleeps).
The harness reads the lines for the first step at a new world.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
stuck_at = int(os.environ.get("BENCH_STUCK_AT", "-1"))
for step in range(int(sys.argv[1])):
    if step == stuck_at:
        print(f"stuck at {time.time():.3f}", flush=True)
        if os.environ.get("BENCH_STUCK_HOW") == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        if os.environ.get("BENCH_STUCK_HOW") == "dstate":  # vfork's parent waits in D state
            libc = ctypes.CDLL(None)
            if libc.vfork() == 0:
                libc.sleep(1000)
                libc._exit(0)
        time.sleep(1e9)
    t = torch.ones(1)
    dist.all_reduce(t)
    print(f"step {step} rank {rank} world {world} restart {restart} at {time.time():.3f}",
          flush=True)
    time.sleep(0.1)
dist.destroy_process_group()
