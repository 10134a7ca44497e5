"""Compatibility names for backend and device choice; the code lives in :mod:`.backends`.

The backend registry (one entry per backend: gloo, nccl...) and :func:`choose_backend` are in
:mod:`unirank.runtime.backends`; the CUDA facts and the device rule in
:mod:`unirank.runtime.backends.facts`. Importing this module does not import torch.

Reads (through those functions): CUDA_VISIBLE_DEVICES, SLURM_GPUS_PER_TASK, SLURMD_TRES_BIND.
"""

from __future__ import annotations

from unirank.runtime.backends import (
    AUTO,
    KNOWN_BACKENDS,
    CudaFacts,
    choose_backend,
    choose_device,
    cuda_facts,
    gpus_bound_per_task,
    planned_device,
    visible_devices,
)

__all__ = [
    "AUTO",
    "KNOWN_BACKENDS",
    "CudaFacts",
    "choose_backend",
    "choose_device",
    "cuda_facts",
    "gpus_bound_per_task",
    "planned_device",
    "visible_devices",
]
