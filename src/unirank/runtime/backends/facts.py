"""CUDA facts and the device rule: pure functions, testable without a GPU.

The facts about CUDA (:class:`CudaFacts`) are read once from torch by :func:`cuda_facts` (the only
function here that imports torch, and only when called); every other function takes them (and an
environment mapping) as parameters.

Device rule (every backend's default, see :func:`choose_device`): ``cuda:0`` when the process
sees exactly one GPU (``srun --gpus-per-task=1`` gives each task its own
``CUDA_VISIBLE_DEVICES``), else ``cuda:<local_rank mod visible GPUs>``; ``cpu`` without CUDA.

Reads (each function says which): CUDA_VISIBLE_DEVICES, SLURM_GPUS_PER_TASK, SLURMD_TRES_BIND.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from unirank.contract import visible_devices
from unirank.launchers import slurm_vars as V

__all__ = [
    "CudaFacts",
    "choose_device",
    "cuda_facts",
    "gpus_bound_per_task",
    "planned_device",
    "visible_devices",
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


def gpus_bound_per_task(environ: Mapping[str, str]) -> bool:
    """True when the launcher gave each task its own GPU(s) (``srun --gpus-per-task``).

    Slurm 22.05's srun does not export SLURM_GPUS_PER_TASK to the tasks; it does export
    ``SLURMD_TRES_BIND=gpu:per_task:N`` (as Slurm 22.05 sets it), so both are read.

    Reads: SLURM_GPUS_PER_TASK, SLURMD_TRES_BIND.
    """
    value = environ.get(V.GPUS_PER_TASK, "").strip()
    # "1" or "type:1"
    count = value.rsplit(":", 1)[-1]
    if count.isdigit() and int(count) >= 1:
        return True
    for binding in environ.get(V.TRES_BIND, "").split(","):
        parts = binding.strip().split(":")
        if len(parts) == 3 and parts[:2] == ["gpu", "per_task"] and parts[2].isdigit():
            return int(parts[2]) >= 1
    return False


def choose_device(local_rank: int, facts: CudaFacts) -> str:
    """``"cuda:<index>"`` for ``local_rank``, or ``"cpu"`` without CUDA.

    A process that sees exactly one GPU uses ``cuda:0`` whatever its local rank; otherwise
    ``cuda:<local_rank mod device_count>`` (more ranks than GPUs share them round-robin, which
    only gloo can do).
    """
    if not facts.available or facts.device_count <= 0:
        return "cpu"
    if facts.device_count == 1:
        return "cuda:0"
    return f"cuda:{local_rank % facts.device_count}"


def planned_device(
    environ: Mapping[str, str], local_rank: int, *, cuda_available: bool = True
) -> str:
    """The device a rank would use, judged from ``CUDA_VISIBLE_DEVICES`` alone (no CUDA call).

    For checking a launcher's GPU binding on machines whose GPUs are fake: with
    ``CUDA_VISIBLE_DEVICES`` unset or hiding everything the answer is ``cpu``.

    Reads: CUDA_VISIBLE_DEVICES.
    """
    shown = visible_devices(environ)
    count = len(shown) if shown is not None else 0
    facts = CudaFacts(
        available=cuda_available and count > 0, device_count=count, nccl_available=True
    )
    return choose_device(local_rank, facts)
