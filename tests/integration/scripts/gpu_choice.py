"""Print, as ``GPU_CHOICE {json}``, this task's GPU binding and the backend and device unirank
would choose for it.

The testbed's GPUs are fake (``/dev/fakegpu*``, no CUDA behind them), so CUDA's own answers are
*simulated* from what Slurm bound: "CUDA available, as many devices as ``CUDA_VISIBLE_DEVICES``
lists, NCCL built in". With those facts the same pure functions that :func:`unirank.init` uses
(:func:`choose_backend`, :func:`choose_device`, and :mod:`unirank.gpus`'s
:func:`gpus_bound_per_task` and :func:`planned_device`) are called on this task's real
environment and real detected layout.

Reads: CUDA_VISIBLE_DEVICES, SLURM_PROCID, SLURM_LOCALID, SLURMD_NODENAME, SLURM_STEP_GPUS,
SLURM_GPUS_PER_TASK and whatever launcher detection reads.
"""

from __future__ import annotations

import json
import os

from unirank.gpus import gpus_bound_per_task, planned_device, visible_devices
from unirank.launchers import detect
from unirank.runtime.backends import CudaFacts, choose_backend, choose_device

if __name__ == "__main__":
    env = detect(os.environ, [])
    shown = visible_devices(os.environ) or []
    facts = CudaFacts(available=bool(shown), device_count=len(shown), nccl_available=True)
    record = {
        "rank": env.rank,
        "local_rank": env.local_rank,
        "local_world_size": env.local_world_size,
        "node": env.node_name,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "step_gpus": os.environ.get("SLURM_STEP_GPUS"),
        "per_task_gpus": gpus_bound_per_task(os.environ),
        "backend": choose_backend(
            "auto", facts, local_world_size=env.local_world_size,
            per_task_gpus=gpus_bound_per_task(os.environ),
        ),
        "device": choose_device(env.local_rank, facts),
        "planned_device": planned_device(os.environ, env.local_rank),
    }
    print("GPU_CHOICE " + json.dumps(record), flush=True)
