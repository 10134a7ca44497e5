"""GPUs without torch: which ones a process sees, which one each local rank uses, and whether
nccl fits a layout. The one home of these three answers for the runtime's backend choice, the
supervisor, ``unirank doctor`` and ``unirank sbatch``.

Every function takes an environment mapping or counts; none reads the process environment or
imports torch. The only file read is the NVIDIA driver's GPU list (:func:`driver_gpu_count`), for a
process whose ``CUDA_VISIBLE_DEVICES`` is unset.

Visibility: ``CUDA_VISIBLE_DEVICES`` lists the devices a process sees; CUDA stops at the first
entry that is not a device (empty, negative, Slurm's ``NoDevFiles``).

Binding (:func:`device_index`): a process that sees exactly one GPU uses it (``cuda:0``,
whatever its local rank: ``srun --gpus-per-task=1`` gives each task its own); otherwise local
rank ``r`` uses visible GPU ``r mod visible GPUs`` (more ranks than GPUs share them
round-robin, which only gloo can do).

nccl fits (:func:`nccl_fits`): every local rank has a GPU of its own, i.e. at least one GPU is
visible and there are as many visible GPUs as ranks on the node, or the launcher bound GPUs per
task (:func:`gpus_bound_per_task`). ``auto`` picks nccl exactly then.

Reads (from the mapping given, each function says which): CUDA_VISIBLE_DEVICES,
SLURM_GPUS_PER_TASK, SLURMD_TRES_BIND.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from unirank.launchers.slurm_vars import GPUS_PER_TASK, TRES_BIND

__all__ = [
    "COMMAND_BACKENDS",
    "NVIDIA_PROC_DIR",
    "VISIBLE_DEVICES_VAR",
    "count_visible_devices",
    "device_index",
    "driver_gpu_count",
    "gpus_bound_per_task",
    "nccl_fits",
    "own_gpu",
    "physical_gpu",
    "planned_device",
    "visible_devices",
    "visible_gpu_count",
]

#: the variable that lists the GPUs a process sees
VISIBLE_DEVICES_VAR = "CUDA_VISIBLE_DEVICES"
#: the process-group backends a command's ``--backend`` offers (``unirank sbatch``, ``bench``,
#: ``doctor``): ``auto`` picks nccl exactly where it fits (:func:`nccl_fits`), else gloo
COMMAND_BACKENDS = ("auto", "gloo", "nccl")
#: one entry per GPU the NVIDIA driver knows on this node
NVIDIA_PROC_DIR = "/proc/driver/nvidia/gpus"


def _entries(value: str) -> list[str]:
    """The devices of one ``CUDA_VISIBLE_DEVICES`` value, up to the first non-device."""
    shown: list[str] = []
    for entry in value.split(","):
        item = entry.strip()
        if not item or item.startswith("-") or item.lower() == "nodevfiles":
            break
        shown.append(item)
    return shown


def visible_devices(environ: Mapping[str, str]) -> list[str] | None:
    """The devices ``CUDA_VISIBLE_DEVICES`` selects, or ``None`` when it is unset.

    CUDA stops at the first entry that is not a device, so an empty value, or one whose first
    entry is negative (``-1``) or ``NoDevFiles`` (Slurm's marker for a job without GPUs), hides
    every device. Reads: CUDA_VISIBLE_DEVICES.
    """
    value = environ.get(VISIBLE_DEVICES_VAR)
    return None if value is None else _entries(value)


def count_visible_devices(value: str) -> int:
    """The number of devices a ``CUDA_VISIBLE_DEVICES`` value selects (see
    :func:`visible_devices`)."""
    return len(_entries(value))


def driver_gpu_count(proc_dir: str = NVIDIA_PROC_DIR) -> int:
    """The GPUs the NVIDIA driver lists under ``proc_dir`` (0 when there is no driver)."""
    try:
        return len([name for name in os.listdir(proc_dir) if not name.startswith(".")])
    except OSError:
        return 0


def visible_gpu_count(environ: Mapping[str, str], proc_dir: str = NVIDIA_PROC_DIR) -> int:
    """GPUs this process may use: counted from CUDA_VISIBLE_DEVICES when set, else the NVIDIA
    driver's entries under ``proc_dir`` (0 when there is no driver).

    Reads: CUDA_VISIBLE_DEVICES.
    """
    shown = visible_devices(environ)
    return len(shown) if shown is not None else driver_gpu_count(proc_dir)


def gpus_bound_per_task(environ: Mapping[str, str]) -> bool:
    """True when the launcher gave each task its own GPU(s) (``srun --gpus-per-task``).

    Slurm 22.05's srun does not export SLURM_GPUS_PER_TASK to the tasks; it does export
    ``SLURMD_TRES_BIND=gpu:per_task:N``, so both are read.

    Reads: SLURM_GPUS_PER_TASK, SLURMD_TRES_BIND.
    """
    count = environ.get(GPUS_PER_TASK, "").strip().rsplit(":", 1)[-1]  # "1" or "type:1"
    if count.isdigit() and int(count) >= 1:
        return True
    for binding in environ.get(TRES_BIND, "").split(","):
        parts = binding.strip().split(":")
        if len(parts) == 3 and parts[:2] == ["gpu", "per_task"] and parts[2].isdigit():
            return int(parts[2]) >= 1
    return False


def nccl_fits(visible_gpus: int, local_ranks: int, *, per_task_gpus: bool) -> bool:
    """Whether every one of ``local_ranks`` ranks on a node has a GPU of its own (two ranks
    cannot share one GPU under nccl): ``visible_gpus`` (what each rank's process sees) is at
    least 1 and at least ``local_ranks``, or the launcher bound GPUs per task
    (``per_task_gpus``, see :func:`gpus_bound_per_task`)."""
    return visible_gpus >= 1 and (per_task_gpus or visible_gpus >= local_ranks)


def device_index(local_rank: int, visible_gpus: int) -> int | None:
    """The index (among the visible GPUs) of the GPU ``local_rank`` uses, or ``None`` (the CPU)
    when no GPU is visible: 0 for a process that sees one GPU, else ``local_rank mod
    visible_gpus``."""
    if visible_gpus <= 0:
        return None
    return 0 if visible_gpus == 1 else local_rank % visible_gpus


def planned_device(
    environ: Mapping[str, str], local_rank: int, *, cuda_available: bool = True
) -> str:
    """The device a rank would use, judged from ``CUDA_VISIBLE_DEVICES`` alone (no CUDA call):
    ``cuda:<index>`` (see :func:`device_index`), or ``cpu`` when ``cuda_available`` is false or
    ``CUDA_VISIBLE_DEVICES`` is unset or hides everything.

    Reads: CUDA_VISIBLE_DEVICES.
    """
    shown = visible_devices(environ)
    index = device_index(local_rank, len(shown) if shown and cuda_available else 0)
    return "cpu" if index is None else f"cuda:{index}"


def physical_gpu(environ: Mapping[str, str], local_rank: int, visible_gpus: int) -> str | None:
    """The GPU ``local_rank`` uses as the node names it (its entry in CUDA_VISIBLE_DEVICES, else
    its index), when the process sees ``visible_gpus`` GPUs; ``None`` on the CPU.

    Reads: CUDA_VISIBLE_DEVICES.
    """
    index = device_index(local_rank, visible_gpus)
    if index is None:
        return None
    shown = visible_devices(environ)
    return shown[index] if shown and index < len(shown) else str(index)


def own_gpu(environ: Mapping[str, str], local_rank: int) -> str | None:
    """The ``CUDA_VISIBLE_DEVICES`` value that shows worker ``local_rank`` only its own GPU
    (``unirank run --virtual-local-rank``): its entry of the visible list (round-robin), its
    index when the variable is unset, ``None`` (leave the variable as it is) when it hides
    every GPU.

    Reads: CUDA_VISIBLE_DEVICES.
    """
    shown = visible_devices(environ)
    if shown is None:
        return str(local_rank)
    return shown[local_rank % len(shown)] if shown else None
