"""Sub-groups of ranks: :func:`new_group` and the ``group=`` argument of the collectives.

A ``group`` is ``None`` (every rank), a ``torch.distributed`` process group, or a list of
global ranks, which :func:`resolve` turns into a group with :func:`new_group` (a collective
call: every rank of the world must make it, members or not). Without a process group (a serial
run) :func:`new_group` returns the list itself and every collective ignores it.

The backends that are not a torch.distributed group (Horovod, XLA) have no sub-groups here:
:func:`new_group` raises ValueError on them, as the collectives do for a ``group`` they get.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from unirank.runtime import state

__all__ = ["is_rank_list", "new_group", "not_member", "resolve"]


def is_rank_list(group: Any) -> bool:
    """True when ``group`` is a list of ints (global ranks)."""
    return isinstance(group, list) and all(isinstance(item, int) for item in group)


def new_group(ranks: list[int], **kwargs: Any) -> Any:
    """A process group of the global ``ranks`` (every rank of the world must call it).

    ``kwargs`` go to ``torch.distributed.new_group`` (``backend``, ``pg_options``, ``timeout``).
    Without a process group it returns ``ranks`` as it is. Raises ValueError when ``ranks`` is
    not a list of ints, or on a backend that has no sub-groups (Horovod, XLA).
    """
    if not is_rank_list(ranks):
        raise ValueError(f"Argument ranks should be list of int: new_group takes a list of global "
                         f"ranks, got {ranks!r}")
    if not state.is_initialized():
        return ranks
    active = state.active()
    if active is not None and active.collectives is not None:
        raise ValueError(
            f"the {active.name} backend has no torch.distributed process groups: "
            "new_group needs gloo, nccl or another torch.distributed backend"
        )
    return dist.new_group(ranks=ranks, **kwargs)


def resolve(group: Any) -> Any:
    """``group`` ready for torch.distributed: a list of ranks becomes a new group, ``None`` and a
    group stay as they are; anything else is a ValueError (as in ignite) while a
    torch.distributed group is live. Call it on every rank (a list of ranks is a collective
    call)."""
    if group is None or not state.torch_group_exists() or state.active() is not None:
        return group
    if is_rank_list(group):
        return new_group(group)
    non_member = getattr(dist.GroupMember, "NON_GROUP_MEMBER", object())
    if not isinstance(group, dist.ProcessGroup) and group is not non_member:
        raise ValueError(f"Argument group should be list of int or ProcessGroup, got "
                         f"{type(group)}, group={group!r}")
    return group


def not_member(group: Any) -> bool:
    """True when ``group`` (already resolved) is a torch.distributed group this rank is not in."""
    if group is None or not state.torch_group_exists() or is_rank_list(group):
        return False
    return bool(dist._rank_not_in_group(group))  # type: ignore[attr-defined]
