"""The init watchdog at each group's start: every rank starts its process group within the init
timeout, or the ranks that did not are named.

The worker's bootstrap has every rank join when its process starts (:mod:`.store`); a rank
can still be slow *after* that, before it starts its group (it loads data, waits on a file
system) while the others already wait in theirs, where torch would wait its own 30 minutes and
then say little. So the bootstrap wraps ``torch.distributed.init_process_group`` (which
:func:`unirank.init` calls too) with :func:`install`: before a call starts the run's group, the
rank announces itself in the store under that call's number (``unirank/group/<n>/``, the n-th
group this process starts) and waits for every rank (:func:`unirank.joincheck.announce_and_wait`,
three or four store calls of one key each). Ranks that have not started that group within the
init timeout are named by the :class:`~unirank.joincheck.InitTimeoutError` that the call raises
in every waiting rank.

The timeout is counted by each waiting rank from its own group start, so the run fails the init
timeout after the first rank started its group. A rank whose program never starts a group (no
distributed work) is never waited for: the wait begins only when some rank starts one. A call
for another world (other ``rank`` or ``world_size``) or after the group exists is passed on
unwatched.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from unirank.hang.recorder import recorder_started
from unirank.joincheck import InitTimeoutError, JoinAbortedError, announce_and_wait
from unirank.storekeys.init import GROUP_PREFIX, group_prefix
from unirank.supervisor.worker.info import WorkerInfo

__all__ = ["GROUP_PREFIX", "install"]



def _for_this_world(bound: inspect.BoundArguments, info: WorkerInfo) -> bool:
    """Whether an ``init_process_group`` call starts this run's world (its ``rank`` and
    ``world_size``, where given, are this worker's)."""
    rank = bound.arguments.get("rank", -1)
    world_size = bound.arguments.get("world_size", -1)
    return rank in (-1, None, info.rank) and world_size in (-1, None, info.world_size)


def install(store: Any, info: WorkerInfo) -> Callable[[], None]:
    """Wrap ``init_process_group`` (in ``torch.distributed`` and its ``distributed_c10d``) so
    that each start of this run's group first waits, at most ``info.init_timeout``, until
    every rank has started it (see the module docstring). ``store``: the store the bootstrap
    joined on. Returns the function that puts the original back and lets go of ``store``
    (the worker's end)."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    original = c10d.init_process_group
    signature = inspect.signature(original)
    starts = [0]
    held = [store]

    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        try:
            bound = signature.bind_partial(*args, **kwargs)
        except TypeError:  # torch's own call says what is wrong
            return original(*args, **kwargs)
        if held and not c10d.is_initialized() and _for_this_world(bound, info):
            starts[0] += 1
            try:
                _wait_for_every_rank(held[0], info, starts[0] - 1)
            except (InitTimeoutError, JoinAbortedError) as exc:
                # its traceback ends here, as if init_process_group raised it
                raise exc.with_traceback(None) from None
        started = original(*args, **kwargs)
        recorder_started()
        return started

    modules = [m for m in (dist, c10d) if getattr(m, "init_process_group", None) is original]
    for module in modules:
        setattr(module, "init_process_group", init_process_group)  # noqa: B010

    def uninstall() -> None:
        held.clear()
        for module in modules:
            if getattr(module, "init_process_group", None) is init_process_group:
                setattr(module, "init_process_group", original)  # noqa: B010

    return uninstall


def _wait_for_every_rank(store: Any, info: WorkerInfo, start: int) -> None:
    """Announce this rank's ``start``-th group start and wait for every rank's (raises
    InitTimeoutError naming the ranks that did not come, JoinAbortedError)."""
    import torch.distributed as dist

    announce_and_wait(
        dist.PrefixStore(group_prefix(start), store),  # type: ignore[attr-defined]
        rank=info.rank, world_size=info.world_size, node_name=info.node_name,
        timeout=info.init_timeout, rank_to_node=info.node_of, group_start=True,
    )

