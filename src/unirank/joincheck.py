"""The init watchdog: every rank announces itself in the rendezvous store and waits for the others.

When some ranks never start (a node that failed to boot, a wrong task count, a typo in
``--node-rank``), torch would wait for its generic 30-minute timeout and then say little. Here each
rank that did start fails within the init timeout with a one-line message that names the missing
ranks and, where known, their nodes.

Used by ``unirank run``'s worker bootstrap and by :func:`unirank.init`. This module does not
import torch: it only calls the store's ``set``, ``wait`` and ``check``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, Protocol

__all__ = [
    "JOIN_PREFIX",
    "InitTimeoutError",
    "StoreLike",
    "announce_and_wait",
    "format_ranks",
    "join_key",
]

JOIN_PREFIX = "unirank/join/"
#: at most this many groups of missing ranks are listed in the message
_MAX_GROUPS = 8


class StoreLike(Protocol):
    """The part of ``torch.distributed.Store`` the watchdog uses."""

    def set(self, key: str, value: Any) -> Any: ...

    def wait(self, keys: list[str], timeout: timedelta) -> Any: ...

    def check(self, keys: list[str]) -> bool: ...


def join_key(rank: int) -> str:
    """The store key rank ``rank`` sets when it joins."""
    return f"{JOIN_PREFIX}{rank}"


def format_ranks(ranks: Sequence[int]) -> str:
    """``rank 3`` or ``ranks 0-2, 5, 7-9`` (sorted, runs compressed)."""
    values = sorted(set(ranks))
    if not values:
        return "no ranks"
    runs: list[str] = []
    start = prev = values[0]
    for value in [*values[1:], None]:
        if value is not None and value == prev + 1:
            prev = value
            continue
        runs.append(str(start) if start == prev else f"{start}-{prev}")
        if value is not None:
            start = prev = value
    return ("rank " if len(values) == 1 else "ranks ") + ", ".join(runs)


def _format_seconds(seconds: float) -> str:
    return f"{seconds:g} s"


class InitTimeoutError(RuntimeError):
    """Some ranks did not join within the init timeout.

    ``missing_ranks`` lists them (empty when the store could no longer say which);
    ``nodes`` maps each to its node's name where known.
    """

    def __init__(
        self,
        missing_ranks: Sequence[int],
        *,
        world_size: int,
        timeout: float,
        nodes: dict[int, str | None] | None = None,
        rank: int | None = None,
    ) -> None:
        self.missing_ranks: list[int] = sorted(missing_ranks)
        self.world_size = world_size
        self.timeout = timeout
        self.nodes: dict[int, str | None] = dict(nodes or {})
        self.rank = rank
        super().__init__(self._message())

    def _describe_missing(self) -> str:
        groups: dict[str | None, list[int]] = {}
        for missing in self.missing_ranks:
            groups.setdefault(self.nodes.get(missing), []).append(missing)
        parts = [
            format_ranks(ranks) + (f" (node {node})" if node else "")
            for node, ranks in groups.items()
        ]
        if len(parts) > _MAX_GROUPS:
            parts = [*parts[:_MAX_GROUPS], f"and {len(parts) - _MAX_GROUPS} more nodes"]
        return "; ".join(parts)

    def _message(self) -> str:
        who = f"rank {self.rank}: " if self.rank is not None else ""
        waited = _format_seconds(self.timeout)
        if self.missing_ranks:
            what = (
                f"{len(self.missing_ranks)} of {self.world_size} ranks did not join within "
                f"{waited}: {self._describe_missing()}."
            )
        else:
            what = (
                f"not every one of the {self.world_size} ranks joined within {waited}, and the "
                "rendezvous store could not tell which are missing."
            )
        return (
            f"{who}init timeout: {what} Check that those ranks were started (task counts of "
            "srun/mpirun, --nnodes and --node-rank on every node), that their nodes reach "
            "MASTER_ADDR:MASTER_PORT, or raise --init-timeout / UNIRANK_INIT_TIMEOUT."
        )


def _missing(store: StoreLike, world_size: int) -> list[int] | None:
    """The ranks whose join key is absent, or None when the store cannot be asked."""
    try:
        return [r for r in range(world_size) if not store.check([join_key(r)])]
    except (RuntimeError, OSError):
        return None


def announce_and_wait(
    store: StoreLike,
    *,
    rank: int,
    world_size: int,
    node_name: str,
    timeout: float,
    rank_to_node: Callable[[int], str | None] | None = None,
) -> None:
    """Set ``unirank/join/<rank>`` = ``node_name`` in ``store``, then wait for every rank's key.

    Returns when all ``world_size`` ranks have joined. Raises :class:`InitTimeoutError` when they
    have not after ``timeout`` seconds, naming the missing ranks and (through ``rank_to_node``)
    their nodes. Other store errors before the deadline (the store's host went away) propagate.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside the world of {world_size}")
    deadline = time.monotonic() + timeout
    store.set(join_key(rank), node_name)
    keys = [join_key(r) for r in range(world_size)]
    try:
        store.wait(keys, timedelta(seconds=max(timeout, 0.001)))
        return
    except (RuntimeError, TimeoutError):
        if time.monotonic() < deadline - 0.05 * timeout:
            raise
    missing = _missing(store, world_size)
    if missing == []:
        return  # the last rank arrived as the wait ran out
    nodes = {r: rank_to_node(r) for r in missing} if (missing and rank_to_node) else {}
    raise InitTimeoutError(
        missing or [], world_size=world_size, timeout=timeout, nodes=nodes, rank=rank
    ) from None
