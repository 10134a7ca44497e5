"""The nccl backend: NVIDIA GPUs, one per rank.

``auto`` picks it over gloo when CUDA and NCCL are usable and nccl fits the node's layout
(:func:`unirank.gpus.nccl_fits`: every local rank has a GPU of its own, as many visible GPUs as
local ranks, or a launcher that binds GPUs per task). Asked for explicitly without
CUDA or without NCCL in this torch build it is a ConfigError. ``init`` makes the rank's GPU the
current CUDA device before ``init_process_group``; a live nccl group's device is the current CUDA
device (which init, or the user who made the group, set).
"""

from __future__ import annotations

from unirank.gpus import nccl_fits
from unirank.runtime.backends.base import Backend, torch_finalize, torch_init
from unirank.runtime.backends.facts import CudaFacts

__all__ = ["BACKEND"]


def problem(facts: CudaFacts) -> str | None:
    """Why nccl cannot run here (a phrase after "the nccl backend"), or ``None``."""
    if not facts.available or facts.device_count == 0:
        return "needs CUDA, and torch sees no CUDA device here"
    if not facts.nccl_available:
        return "is not available in this torch build"
    return None


def auto_applies(facts: CudaFacts, *, local_world_size: int, per_task_gpus: bool) -> bool:
    """nccl fits this node's layout (see :func:`unirank.gpus.nccl_fits`)."""
    return nccl_fits(facts.device_count, local_world_size, per_task_gpus=per_task_gpus)


def current_device() -> str:
    """The current CUDA device of this process (imports torch)."""
    import torch

    return f"cuda:{torch.cuda.current_device()}"


BACKEND = Backend(
    name="nccl",
    init=torch_init("nccl"),
    finalize=torch_finalize,
    auto_priority=100,
    auto_applies=auto_applies,
    problem=problem,
    problem_hint="use backend 'gloo' (or 'auto', which picks gloo without GPUs), "
    "or run on a node with CUDA GPUs",
    current_device=current_device,
)
