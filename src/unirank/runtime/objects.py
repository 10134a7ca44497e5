"""Gathering and broadcasting Python objects over a torch.distributed group as byte tensors
(pickled), so that no collective of objects needs numpy (torch's ``all_gather_object`` and
``broadcast_object_list`` do).

Each call is collective over ``group``: every member must make it. Bytes travel as ``uint8``
tensors on ``device`` (the CUDA device for nccl, else the CPU), lengths as ``int64``.
"""

from __future__ import annotations

import pickle
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["all_gather_objects", "broadcast_object", "comm_device"]


def comm_device() -> torch.device:
    """Where the default group's backend takes tensors: the current CUDA device for nccl,
    else the CPU."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _to_tensor(obj: Any, device: torch.device) -> torch.Tensor:
    payload = bytearray(pickle.dumps(obj))
    return torch.frombuffer(payload, dtype=torch.uint8).to(device)


def _from_tensor(tensor: torch.Tensor) -> Any:
    return pickle.loads(bytes(tensor.cpu().tolist()))


def all_gather_objects(obj: Any, group: Any = None) -> list[Any]:
    """Every member's ``obj``, in the group's rank order."""
    device = comm_device()
    mine = _to_tensor(obj, device)
    size = dist.get_world_size(group)
    length = torch.tensor([mine.numel()], dtype=torch.int64, device=device)
    lengths = [torch.zeros_like(length) for _ in range(size)]
    dist.all_gather(lengths, length, group=group)
    longest = max(int(n.item()) for n in lengths)
    padded = torch.zeros(longest, dtype=torch.uint8, device=device)
    padded[: mine.numel()] = mine
    parts = [torch.empty_like(padded) for _ in range(size)]
    dist.all_gather(parts, padded, group=group)
    return [_from_tensor(part[: int(n.item())]) for part, n in zip(parts, lengths)]


def broadcast_object(obj: Any, src: int, group: Any = None) -> Any:
    """Global rank ``src``'s ``obj`` on every member (the others' ``obj`` is ignored)."""
    device = comm_device()
    is_src = dist.get_rank() == src
    payload = _to_tensor(obj, device) if is_src else torch.empty(0, dtype=torch.uint8)
    length = torch.tensor([payload.numel()], dtype=torch.int64, device=device)
    dist.broadcast(length, src=src, group=group)
    if not is_src:
        payload = torch.empty(int(length.item()), dtype=torch.uint8, device=device)
    dist.broadcast(payload, src=src, group=group)
    return obj if is_src else _from_tensor(payload)
