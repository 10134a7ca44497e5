"""The worker binds itself to its ``--numa-binding`` CPUs before the program starts.

The supervisor passes ``MODE LOCAL_RANK/LOCAL_WORLD_SIZE`` (its own numbers, which
``--virtual-local-rank`` does not change); the CPUs come from :func:`unirank.numa.binding_cpus`.
Where every local rank uses a GPU, a rank's home NUMA node is its GPU's, read as torch's
``--numa-binding`` reads it (the GPU's PCI address from CUDA, its ``numa_node`` from sysfs).
``sched_setaffinity`` on the one thread the worker has at this point binds every thread the
program starts later, and an ``--exec`` program keeps it across ``exec``.

Reads: UNIRANK_NUMA_BINDING, CUDA_VISIBLE_DEVICES (through :mod:`unirank.gpus`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

from unirank import gpus, numa
from unirank.contract import NUMA_BINDING_VAR

__all__ = ["bind", "bind_or_exit", "parse_setting"]

#: the exit status of a worker that cannot be bound (a usage error)
CANNOT_BIND = 2


def parse_setting(value: str) -> tuple[str, int, int]:
    """``exclusive 3/8`` as ``("exclusive", 3, 8)``."""
    mode, _, slot = value.partition(" ")
    local_rank, _, local_world_size = slot.partition("/")
    return mode, int(local_rank), int(local_world_size)


def _gpu_numa_node(index: int, sys_root: str) -> int:
    import torch

    props: Any = torch.cuda.get_device_properties(index)  # its PCI numbers are not typed
    address = f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
    try:
        with open(os.path.join(sys_root, "bus/pci/devices", address, "numa_node"),
                  encoding="ascii") as f:
            return max(int(f.read().strip()), 0)
    except (OSError, ValueError):
        return 0


def _gpu_homes(environ: Mapping[str, str], local_world_size: int,
               sys_root: str) -> list[int] | None:
    """Each local rank's GPU's NUMA node, or None when some rank uses no GPU of its own."""
    visible = gpus.visible_gpu_count(environ)
    indices = [gpus.device_index(rank, visible) for rank in range(local_world_size)]
    if visible == 0 or any(index is None for index in indices):
        return None
    return [_gpu_numa_node(index, sys_root) for index in indices if index is not None]


def bind(environ: Mapping[str, str], sys_root: str = "/sys") -> frozenset[int] | None:
    """Bind this process to its CPUs when ``--numa-binding`` was given; the CPUs, or None."""
    value = environ.get(NUMA_BINDING_VAR, "")
    if not value:
        return None
    mode, local_rank, local_world_size = parse_setting(value)
    topology = numa.read_topology(sys_root)
    homes = numa.home_nodes(topology, local_world_size,
                            _gpu_homes(environ, local_world_size, sys_root))
    cpus = numa.binding_cpus(mode, topology, local_rank, homes)
    os.sched_setaffinity(0, cpus)
    return cpus


def bind_or_exit(environ: Mapping[str, str], rank: int) -> None:
    """:func:`bind`, or one line on stderr and exit :data:`CANNOT_BIND` when it cannot."""
    from unirank.errors import ConfigError

    try:
        bind(environ)
    except (ConfigError, OSError) as exc:
        print(f"unirank: rank {rank}: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(CANNOT_BIND) from None
