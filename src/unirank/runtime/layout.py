"""The per-node numbers of a process group the launcher's description does not describe (a
group made by hand with ``init_process_group(rank=r, world_size=n)``), as ignite derives them.

* local rank: ``LOCAL_RANK`` (``SLURM_LOCALID`` under Slurm), else the ``set_local_rank`` hint,
  else from the node names of every rank (gathered over the group, each named by the one
  node-name rule, :func:`own_node_name`: ranks on the same node are numbered in rank order);
* processes per node: the largest local rank + 1 over the group (an all-reduce on a gloo
  group, so a badly configured NCCL is not involved);
* nodes and node rank: ranks fill nodes of that many slots in order, the last node may be
  partly filled (:func:`unirank.placement.by_slot`; the node rank from the host names when
  those gave the local rank).

Finding them is a collective call: every rank of the group must make its first getter call for
the group (ignite has the same rule). They are cached per group and local rank.
"""

from __future__ import annotations

import socket
import warnings
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from unirank.launchers import slurm_vars
from unirank.launchers._base import Context, node_name
from unirank.placement import by_slot

__all__ = ["Layout", "group_layout", "local_rank_from", "node_and_local_rank", "own_node_name",
           "place"]


@dataclass(frozen=True)
class Layout:
    """This rank's place on its node: local rank, processes per node, node rank, nodes."""

    local_rank: int
    local_world_size: int
    node_rank: int
    num_nodes: int


#: the last layout found: (the group, the local rank it was found for, the layout)
_CACHE: list[tuple[Any, int, Layout]] = []


def local_rank_from(environ: Mapping[str, str], hint: int | None) -> int | None:
    """The local rank the environment (or ``set_local_rank``'s ``hint``) gives, else ``None``.

    Reads: SLURM_JOB_ID, SLURM_JOBID, SLURM_LOCALID, LOCAL_RANK.
    """
    if slurm_vars.in_job(environ) and slurm_vars.LOCALID in environ:
        return int(environ[slurm_vars.LOCALID])
    if "LOCAL_RANK" in environ:
        return int(environ["LOCAL_RANK"])
    return hint


def node_and_local_rank(rank: int, hostnames: list[str]) -> tuple[int, int]:
    """``rank``'s (node rank, local rank) when ``hostnames[r]`` is rank ``r``'s host: nodes in
    order of first appearance, each holding a run of consecutive ranks (ignite's rule)."""
    start = 0
    for node, size in enumerate(Counter(hostnames).values()):
        if rank < start + size:
            return node, rank - start
        start += size
    raise ValueError(f"rank {rank} is outside the {len(hostnames)} ranks of {hostnames}")


def place(rank: int, world_size: int, local_rank: int, per_node: int,
          node: int | None = None) -> Layout:
    """This rank's layout from its local rank and the processes per node: the node from the
    host names when they gave it (``node``), else :func:`unirank.placement.by_slot` (6 ranks at
    4 per node: 2 nodes, the second partly filled). Pure."""
    slot_node, nodes = by_slot(rank, world_size, per_node)
    return Layout(local_rank, per_node, slot_node if node is None else node, nodes)


def own_node_name(environ: Mapping[str, str], hostname: str) -> str:
    """This rank's node name by the one rule (:func:`unirank.launchers._base.node_name`:
    SLURMD_NODENAME, UNIRANK_NODE_NAME, else the host name): clusters whose nodes share a host
    name still tell their nodes apart. Reads: SLURMD_NODENAME, UNIRANK_NODE_NAME."""
    return node_name(environ, Context(hostname=hostname))[0]


def _gathered_hostnames(world_size: int, environ: Mapping[str, str]) -> list[str]:
    """Every rank's node name (:func:`own_node_name`), in rank order (a collective call)."""
    group = dist.new_group(backend="gloo")
    try:
        name = list(own_node_name(environ, socket.gethostname()).encode("utf-8"))[:255]
        mine = torch.zeros(256, dtype=torch.long)
        mine[: len(name)] = torch.tensor(name, dtype=torch.long)
        mine[-1] = len(name)
        out = [torch.zeros_like(mine) for _ in range(world_size)]
        dist.all_gather(out, mine, group=group)
    finally:
        dist.destroy_process_group(group)
    return [bytes(t[: int(t[-1])].tolist()).decode("utf-8") for t in out]


def _largest_local_rank(local_rank: int) -> int:
    """The largest local rank over the default group (a collective call on a gloo group)."""
    group = dist.new_group(backend="gloo")
    try:
        value = torch.tensor([local_rank])
        dist.all_reduce(value, op=dist.ReduceOp.MAX, group=group)
    finally:
        dist.destroy_process_group(group)
    return int(value.item())


def group_layout(environ: Mapping[str, str], hint: int | None) -> Layout:
    """The layout of the live default group, found as this module's docstring says (cached for
    the group and local rank). Reads: SLURM_JOB_ID, SLURM_LOCALID, LOCAL_RANK, SLURMD_NODENAME,
    UNIRANK_NODE_NAME."""
    group = dist.group.WORLD
    rank, world_size = int(dist.get_rank()), int(dist.get_world_size())
    local_rank = local_rank_from(environ, hint)
    node: int | None = None
    if local_rank is None:
        cached = next((c for c in _CACHE if c[0] is group and c[1] < 0), None)
        if cached is not None:
            return cached[2]
        warnings.warn("the local rank is found from the host names of the ranks: set LOCAL_RANK "
                      "(or call set_local_rank) to give it", stacklevel=4)
        node, local_rank = node_and_local_rank(rank, _gathered_hostnames(world_size, environ))
    key = local_rank if node is None else -1
    cached = next((c for c in _CACHE if c[0] is group and c[1] == key), None)
    if cached is not None:
        return cached[2]
    per_node = _largest_local_rank(local_rank) + 1 if world_size > 1 else 1
    layout = place(rank, world_size, local_rank, per_node, node)
    _CACHE[:] = [(group, key, layout)]
    return layout
