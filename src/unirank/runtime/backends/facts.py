"""CUDA facts and the device rule: pure functions, testable without a GPU.

The facts about CUDA (:class:`CudaFacts`) are read once from torch by :func:`cuda_facts` (the only
function here that imports torch, and only when called); :func:`choose_device` takes them as a
parameter.

Device rule (every backend's default, see :func:`choose_device`): the binding of
:func:`unirank.gpus.device_index` applied to the GPUs torch sees: ``cuda:0`` when the process
sees exactly one GPU, else ``cuda:<local_rank mod visible GPUs>``; ``cpu`` without CUDA.

Reads: CUDA_VISIBLE_DEVICES (through torch, in :func:`cuda_facts`).
"""

from __future__ import annotations

from dataclasses import dataclass

from unirank.gpus import device_index

__all__ = [
    "CudaFacts",
    "choose_device",
    "cuda_facts",
]


@dataclass(frozen=True)
class CudaFacts:
    """What this process can see of CUDA: ``device_count`` counts the *visible* GPUs."""

    available: bool
    device_count: int
    nccl_available: bool


def cuda_facts() -> CudaFacts:
    """The CUDA facts of this process, from torch (imports torch when called).

    Reads: CUDA_VISIBLE_DEVICES (through torch).
    """
    import torch
    import torch.distributed as dist

    available = bool(torch.cuda.is_available())
    count = int(torch.cuda.device_count()) if available else 0
    nccl = bool(dist.is_nccl_available())
    return CudaFacts(available=available, device_count=count, nccl_available=nccl)


def choose_device(local_rank: int, facts: CudaFacts) -> str:
    """``"cuda:<index>"`` for ``local_rank`` (see :func:`unirank.gpus.device_index`), or
    ``"cpu"`` without CUDA."""
    index = device_index(local_rank, facts.device_count if facts.available else 0)
    return "cpu" if index is None else f"cuda:{index}"
