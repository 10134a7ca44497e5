"""Backend and device choice: pure functions of a few facts, so they can be tested without a GPU.

The facts about CUDA (:class:`CudaFacts`) are read once from torch by :func:`cuda_facts`; every
other function here takes them (and an environment mapping) as parameters.

Rules:

* Backend ``None``/``"auto"``: ``"nccl"`` when CUDA and NCCL are available and every local rank
  has a GPU of its own (as many visible GPUs as local ranks, or a launcher that binds one GPU per
  task: ``SLURM_GPUS_PER_TASK`` or ``SLURMD_TRES_BIND=gpu:per_task:N``); otherwise ``"gloo"``.
* An explicit ``"nccl"`` without CUDA (or without NCCL in this torch build) is a
  :class:`~unirank.errors.ConfigError`.
* Device: ``cuda:0`` when the process sees exactly one GPU (``srun --gpus-per-task=1`` gives
  each task its own ``CUDA_VISIBLE_DEVICES``), else ``cuda:<local_rank mod visible GPUs>``;
  ``cpu`` without CUDA.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from unirank.errors import ConfigError

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

AUTO = "auto"
#: backends torch.distributed knows by name (``"cpu:gloo,cuda:nccl"`` style strings also pass)
KNOWN_BACKENDS = ("gloo", "nccl", "mpi", "ucc", "xccl")


@dataclass(frozen=True)
class CudaFacts:
    """What this process can see of CUDA: ``device_count`` counts the *visible* GPUs."""

    available: bool
    device_count: int
    nccl_available: bool


def cuda_facts() -> CudaFacts:
    """The CUDA facts of this process, from torch (imports torch)."""
    import torch
    import torch.distributed as dist

    available = bool(torch.cuda.is_available())
    count = int(torch.cuda.device_count()) if available else 0
    nccl = bool(dist.is_nccl_available())
    return CudaFacts(available=available, device_count=count, nccl_available=nccl)


def visible_devices(environ: Mapping[str, str]) -> list[str] | None:
    """The entries of ``CUDA_VISIBLE_DEVICES``, or ``None`` when it is unset.

    An empty value, or one starting with ``-1`` or ``NoDevFiles`` (Slurm's marker for a job with
    no GPU), hides every device: ``[]``. Reads: CUDA_VISIBLE_DEVICES.
    """
    value = environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    entries = [part.strip() for part in value.split(",")]
    shown: list[str] = []
    for entry in entries:
        if not entry or entry.startswith("-1") or entry == "NoDevFiles":
            break  # CUDA stops at the first invalid entry
        shown.append(entry)
    return shown


def gpus_bound_per_task(environ: Mapping[str, str]) -> bool:
    """True when the launcher gave each task its own GPU(s) (``srun --gpus-per-task``).

    Slurm 22.05's srun does not export SLURM_GPUS_PER_TASK to the tasks; it does export
    ``SLURMD_TRES_BIND=gpu:per_task:N`` (seen on the testbed), so both are read.

    Reads: SLURM_GPUS_PER_TASK, SLURMD_TRES_BIND.
    """
    value = environ.get("SLURM_GPUS_PER_TASK", "").strip()
    # "1" or "type:1"
    count = value.rsplit(":", 1)[-1]
    if count.isdigit() and int(count) >= 1:
        return True
    for binding in environ.get("SLURMD_TRES_BIND", "").split(","):
        parts = binding.strip().split(":")
        if len(parts) == 3 and parts[:2] == ["gpu", "per_task"] and parts[2].isdigit():
            return int(parts[2]) >= 1
    return False


def _nccl_unusable(facts: CudaFacts) -> str | None:
    if not facts.available or facts.device_count == 0:
        return "needs CUDA, and torch sees no CUDA device here"
    if not facts.nccl_available:
        return "is not available in this torch build"
    return None


def choose_backend(
    requested: str | None,
    facts: CudaFacts,
    *,
    local_world_size: int = 1,
    per_task_gpus: bool = False,
) -> str:
    """The process-group backend for ``requested`` (``None``/``"auto"``/a backend name).

    ``facts`` are the CUDA facts of this process (simulated in tests); ``local_world_size`` the
    number of ranks on this node; ``per_task_gpus`` whether the launcher bound GPUs per task
    (see :func:`gpus_bound_per_task`). Raises ConfigError for an unusable explicit choice.
    """
    name = AUTO if requested is None else requested.strip().lower()
    if name == AUTO:
        if _nccl_unusable(facts) is not None:
            return "gloo"
        enough = facts.device_count >= local_world_size or per_task_gpus
        return "nccl" if enough else "gloo"
    if name == "nccl":
        problem = _nccl_unusable(facts)
        if problem is not None:
            raise ConfigError(
                f"the nccl backend {problem}",
                variable="backend",
                value=requested,
                hint="use backend 'gloo' (or 'auto', which picks gloo without GPUs), "
                "or run on a node with CUDA GPUs",
            )
        return name
    if name in KNOWN_BACKENDS or ":" in name:
        return name
    raise ConfigError(
        "is not a torch.distributed backend",
        variable="backend",
        value=requested,
        hint=f"use one of: auto, {', '.join(KNOWN_BACKENDS)}",
    )


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
