"""How many GPUs this node shows, found without importing torch.

Reads: CUDA_VISIBLE_DEVICES (and lists ``/proc/driver/nvidia/gpus`` when it is unset).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from unirank.contract import count_visible_devices

__all__ = ["NVIDIA_PROC_DIR", "count_visible_devices", "visible_gpu_count"]

NVIDIA_PROC_DIR = "/proc/driver/nvidia/gpus"


def visible_gpu_count(
    environ: Mapping[str, str], proc_dir: str = NVIDIA_PROC_DIR
) -> int:
    """GPUs this process may use: counted from CUDA_VISIBLE_DEVICES when set, else the NVIDIA
    driver's entries under ``proc_dir`` (0 when there is no driver).

    Reads: CUDA_VISIBLE_DEVICES.
    """
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return count_visible_devices(visible)
    try:
        return len([name for name in os.listdir(proc_dir) if not name.startswith(".")])
    except OSError:
        return 0
