"""The init watchdog: every rank announces itself in the rendezvous store and waits for the others.

When some ranks never start (a node that failed to boot, a wrong task count, a typo in
``--node-rank``), torch would wait for its generic 30-minute timeout and then say little. Here each
rank that did start fails within the init timeout with a one-line message that names the missing
ranks and, where known, their nodes.

Used by ``unirank run``'s worker bootstrap and by :func:`unirank.init`. This module does not
import torch: it only calls the store's ``set``, ``get``, ``wait`` and ``check``. Keys (all under
``unirank/join/``): ``<rank>`` (the rank's node name), and after a timeout ``result`` (rank 0's
verdict) and ``seen/<rank>`` (a rank read it).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, Protocol

__all__ = [
    "JOIN_PREFIX",
    "RESULT_KEY",
    "InitTimeoutError",
    "StoreLike",
    "announce_and_wait",
    "format_ranks",
    "join_key",
]

JOIN_PREFIX = "unirank/join/"
#: rank 0's verdict after a timeout: "missing:" and the missing ranks, comma-separated
RESULT_KEY = "unirank/join/result"
#: after a timeout, rank 0 waits at most this long for the others to read its verdict
LINGER = 10.0
#: at most this many groups of missing ranks are listed in the message
_MAX_GROUPS = 8


class StoreLike(Protocol):
    """The part of ``torch.distributed.Store`` the watchdog uses."""

    def set(self, key: str, value: Any) -> Any: ...

    def wait(self, keys: list[str], timeout: timedelta) -> Any: ...

    def check(self, keys: list[str]) -> bool: ...

    def get(self, key: str) -> Any: ...


def join_key(rank: int) -> str:
    """The store key rank ``rank`` sets when it joins."""
    return f"{JOIN_PREFIX}{rank}"


def _seen_key(rank: int) -> str:
    return f"{JOIN_PREFIX}seen/{rank}"


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
    """Whole seconds, rounded up (a deadline-based timeout of 4.993 s reads as 5 s)."""
    return f"{math.ceil(seconds - 1e-6)} s" if seconds >= 1 else f"{seconds:.2g} s"


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
            format_ranks(ranks) + (f" (on {node})" if node else "")
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


def _expired(exc: BaseException, deadline: float, timeout: float) -> None:
    """Re-raise ``exc`` unless the deadline has (all but) passed: then it was the timeout."""
    if time.monotonic() < deadline - 0.05 * timeout:
        raise exc


def _timeout_error(
    missing: list[int] | None,
    *,
    rank: int,
    world_size: int,
    timeout: float,
    rank_to_node: Callable[[int], str | None] | None,
) -> InitTimeoutError:
    nodes = {r: rank_to_node(r) for r in missing} if (missing and rank_to_node) else {}
    return InitTimeoutError(
        missing or [], world_size=world_size, timeout=timeout, nodes=nodes, rank=rank
    )


def _wait_all(store: StoreLike, world_size: int, timeout: float, deadline: float) -> bool:
    """Wait for every rank's join key: True when all came, False at the deadline."""
    keys = [join_key(r) for r in range(world_size)]
    try:
        store.wait(keys, timedelta(seconds=max(timeout, 0.001)))
        return True
    except (RuntimeError, TimeoutError) as exc:
        _expired(exc, deadline, timeout)
    return False


def _coordinate(
    store: StoreLike,
    *,
    world_size: int,
    timeout: float,
    rank_to_node: Callable[[int], str | None] | None,
) -> None:
    """Rank 0 after its wait ran out: publish the verdict, wait for the others to read it."""
    missing = _missing(store, world_size)
    if missing == []:  # the last rank arrived as the wait ran out
        return
    store.set(RESULT_KEY, "missing:" + ",".join(str(r) for r in missing or []))
    # This process may host the store: stay until the ranks that joined have read the verdict.
    joined = [r for r in range(1, world_size) if r not in (missing or [])]
    if joined:
        with contextlib.suppress(RuntimeError, TimeoutError):
            store.wait([_seen_key(r) for r in joined],
                       timedelta(seconds=min(LINGER, max(timeout, 0.001))))
    raise _timeout_error(missing, rank=0, world_size=world_size, timeout=timeout,
                         rank_to_node=rank_to_node)


def _follow(
    store: StoreLike,
    *,
    rank: int,
    world_size: int,
    timeout: float,
    rank_to_node: Callable[[int], str | None] | None,
) -> None:
    """Any other rank after its wait ran out: take rank 0's verdict, or look for itself."""
    missing: list[int] | None = None
    try:
        if store.check([RESULT_KEY]):
            verdict = bytes(store.get(RESULT_KEY)).decode()
            missing = [int(r) for r in verdict.removeprefix("missing:").split(",") if r]
    except (RuntimeError, OSError, ValueError):
        missing = None
    if missing is None:
        missing = _missing(store, world_size)
        if missing == []:
            return
    with contextlib.suppress(RuntimeError, OSError):
        store.set(_seen_key(rank), "1")
    raise _timeout_error(missing, rank=rank, world_size=world_size, timeout=timeout,
                         rank_to_node=rank_to_node)


def announce_and_wait(
    store: StoreLike,
    *,
    rank: int,
    world_size: int,
    node_name: str,
    timeout: float,
    rank_to_node: Callable[[int], str | None] | None = None,
) -> None:
    """Set ``unirank/join/<rank>`` = ``node_name`` in ``store``, then wait for every rank.

    Returns when all ``world_size`` ranks have joined. Raises :class:`InitTimeoutError` when
    they have not after ``timeout`` seconds, naming the missing ranks and (through
    ``rank_to_node``) their nodes. On a timeout rank 0 publishes which ranks are missing
    (``unirank/join/result``) and, as it usually hosts the store, stays (at most 10 s) until the
    ranks that joined have read it (``unirank/join/seen/<rank>``); the others take that verdict,
    or look at the keys themselves when it is not there yet. Other store errors before the
    deadline (the store's host went away) propagate.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside the world of {world_size}")
    deadline = time.monotonic() + timeout
    store.set(join_key(rank), node_name)
    if _wait_all(store, world_size, timeout, deadline):
        return
    if rank == 0:
        _coordinate(store, world_size=world_size, timeout=timeout, rank_to_node=rank_to_node)
    else:
        _follow(store, rank=rank, world_size=world_size, timeout=timeout,
                rank_to_node=rank_to_node)
