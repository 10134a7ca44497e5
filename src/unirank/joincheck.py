"""The init watchdog: every rank announces itself in the rendezvous store and waits for the others.

When some ranks never start (a node that failed to boot, a wrong task count, a typo in
``--node-rank``), torch would wait for its generic 30-minute timeout and then say little. Here each
rank that did start fails within the init timeout with a one-line message that names the missing
ranks and, where known, their nodes.

Used by ``unirank run``'s worker bootstrap (on the raw store, once per store; then again at
the start of each process group, :mod:`unirank.supervisor.worker.groupstart`) and by
:func:`unirank.init` (under a ``PrefixStore`` per attempt and init, so a restart or a second init
starts from fresh keys). This module does not import torch: it only calls the store's ``set``,
``get``, ``add``, ``wait`` and ``check``.

The protocol costs every rank a constant number of store calls, each naming one key, when all
ranks join (a wait naming all ``world_size`` keys on every rank would cost the store server
``world_size`` squared key look-ups). Keys, all under ``unirank/join/``:

``<rank>``
    the rank's node name; set first, so that a scan after a timeout can tell who is missing.
``count``
    a counter: each rank adds 1 to it (``add``) after setting ``<rank>``.
``all``
    set to ``1`` by the rank whose ``add`` returned ``world_size``; every other rank waits on this
    one key until its deadline, then reads it. Success path: ``set <rank>``, ``add count``, then
    ``wait all`` and ``get all`` (or, on the last rank, ``set all``): at most four calls of one
    key each. A node that gives up before its ranks join (it refused its layout, or found its
    ranks already claimed) sets it to ``abort:`` and its reason (:func:`abort_join`), which
    wakes every waiting rank at once: each raises :class:`JoinAbortedError` with that reason
    (the others first set ``seen/<rank>``, for which rank 0 waits as after a timeout).
``result``
    the verdict after a timeout: ``missing:`` and the missing ranks, comma-separated (empty: all
    joined after all). Rank 0 scans the join keys once (bisecting over ``check`` calls, so a few
    missing ranks cost a few calls) and publishes it. The others first look whether rank 0 joined
    (``check <0>``): if so they wait (at most ``min(LINGER, timeout)``) for its verdict.
``coordinator``
    a counter for the case where rank 0 never joined, or gave no verdict in that time: the rank
    whose ``add`` returns 1 scans and publishes instead, the others wait (as long again) for its
    verdict and otherwise report that the store could not tell which ranks are missing. So one
    rank scans, the others make O(1) calls naming one key each.
``seen/<rank>``
    a rank other than 0 read (or wrote) the verdict; rank 0, which usually hosts the store,
    lingers until the ranks that joined have set it.

Assumption: each rank calls :func:`announce_and_wait` once per store (or prefix). A rank that
called twice would count twice and could release the others before everyone joined.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, Protocol

from unirank.signals import start_shielded
from unirank.storekeys.join import (
    ABORT_PREFIX,
    ALL_KEY,
    COORDINATOR_KEY,
    COUNT_KEY,
    JOIN_PREFIX,
    RESULT_KEY,
    join_key,
    seen_key,
)

__all__ = [
    "ALL_KEY",
    "COORDINATOR_KEY",
    "COUNT_KEY",
    "JOIN_PREFIX",
    "RESULT_KEY",
    "InitTimeoutError",
    "JoinAbortedError",
    "StoreLike",
    "abort_join",
    "announce_and_wait",
    "format_ranks",
    "join_key",
]

#: after a timeout, rank 0 waits at most this long for the others to read its verdict, and the
#: others at most this long (twice, when they elect a coordinator) for a verdict
LINGER = 10.0
#: at most this many groups of missing ranks are listed in the message
_MAX_GROUPS = 8
#: a scan's first checks name at most this many join keys each
_SCAN_CHUNK = 1024


class StoreLike(Protocol):
    """The part of ``torch.distributed.Store`` the watchdog uses."""

    def set(self, key: str, value: Any) -> Any: ...

    def wait(self, keys: list[str], timeout: timedelta) -> Any: ...

    def check(self, keys: list[str]) -> bool: ...

    def get(self, key: str) -> Any: ...

    def add(self, key: str, value: int) -> int: ...




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
        group_start: bool = False,
    ) -> None:
        self.missing_ranks: list[int] = sorted(missing_ranks)
        self.world_size = world_size
        self.timeout = timeout
        self.nodes: dict[int, str | None] = dict(nodes or {})
        self.rank = rank
        #: the wait was at the start of a process group (the ranks run, but have not started it)
        self.group_start = group_start
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
        did, done = (("did not start their process group", "started its process group")
                     if self.group_start else ("did not join", "joined"))
        if self.missing_ranks:
            what = (
                f"{len(self.missing_ranks)} of {self.world_size} ranks {did} within "
                f"{waited}: {self._describe_missing()}."
            )
        else:
            what = (
                f"not every one of the {self.world_size} ranks {done} within {waited}, and "
                "the rendezvous store could not tell which are missing."
            )
        check = ("Check what those ranks do before init_process_group / ur.init (loading data, "
                 "a slow file system)" if self.group_start else
                 "Check that those ranks were started (task counts of srun/mpirun, --nnodes and "
                 "--node-rank on every node), that their nodes reach MASTER_ADDR:MASTER_PORT")
        return (f"{who}init timeout: {what} {check}, or raise --init-timeout / "
                "UNIRANK_INIT_TIMEOUT.")


class JoinAbortedError(RuntimeError):
    """A node gave up before its ranks joined; ``reason`` is its one line (naming the node)."""

    def __init__(self, reason: str, *, rank: int | None = None) -> None:
        self.reason = reason
        self.rank = rank
        who = f"rank {rank}: " if rank is not None else ""
        super().__init__(f"{who}the job was stopped before every rank joined: {reason}")


def abort_join(store: StoreLike, reason: str) -> None:
    """Tell every rank waiting in :func:`announce_and_wait` on ``store`` that the world will not
    be complete: ``reason`` (one line, naming the node and what went wrong) ends their wait at
    once. Store errors propagate."""
    store.set(ALL_KEY, ABORT_PREFIX + " ".join(reason.split()))


def _aborted(store: StoreLike, rank: int, world_size: int) -> None:
    """After ``ALL_KEY`` came: raise JoinAbortedError when a node set it to give up. Rank 0,
    which usually hosts the store, first stays (at most ``LINGER``) until the ranks that joined
    have read it (``seen/<rank>``), as after a timeout."""
    value = bytes(store.get(ALL_KEY)).decode(errors="replace")
    if not value.startswith(ABORT_PREFIX):
        return
    if rank != 0:
        with contextlib.suppress(RuntimeError, OSError):
            store.set(seen_key(rank), "1")
    else:
        missing = _missing(store, world_size)
        joined = [r for r in range(1, world_size) if r not in set(missing or [])]
        if missing is not None and joined:
            with contextlib.suppress(RuntimeError, TimeoutError, OSError):
                store.wait([seen_key(r) for r in joined], timedelta(seconds=LINGER))
    raise JoinAbortedError(value.removeprefix(ABORT_PREFIX), rank=rank)


def _all_came(store: StoreLike, rank: int, world_size: int) -> bool:
    """Whether ``ALL_KEY`` is set (raising JoinAbortedError when a node set it to give up)."""
    if not _has(store, ALL_KEY):
        return False
    _aborted(store, rank, world_size)
    return True


def _missing(store: StoreLike, world_size: int) -> list[int] | None:
    """The ranks whose join key is absent, or None when the store cannot be asked.

    Checks chunks of at most ``_SCAN_CHUNK`` keys and bisects only those that are incomplete, so
    with ``k`` ranks missing it takes about ``world_size / _SCAN_CHUNK + 2 k log2(_SCAN_CHUNK)``
    calls. Only one rank scans per timeout (see the module's docstring).
    """
    missing: list[int] = []
    pending = [(lo, min(lo + _SCAN_CHUNK, world_size)) for lo in range(0, world_size, _SCAN_CHUNK)]
    pending.reverse()
    try:
        while pending:
            lo, hi = pending.pop()
            if store.check([join_key(r) for r in range(lo, hi)]):
                continue
            if hi - lo == 1:
                missing.append(lo)
                continue
            mid = (lo + hi) // 2
            pending += [(mid, hi), (lo, mid)]
    except (RuntimeError, OSError):
        return None
    return sorted(missing)


def _has(store: StoreLike, key: str) -> bool:
    """Whether ``key`` is set; False when the store cannot be asked."""
    try:
        return bool(store.check([key]))
    except (RuntimeError, OSError):
        return False


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
    group_start: bool,
) -> InitTimeoutError:
    nodes = {r: rank_to_node(r) for r in missing} if (missing and rank_to_node) else {}
    return InitTimeoutError(
        missing or [], world_size=world_size, timeout=timeout, nodes=nodes, rank=rank,
        group_start=group_start,
    )


def _join(store: StoreLike, *, rank: int, world_size: int, node_name: str) -> bool:
    """Set this rank's join key and count it: True when it was the last (it then sets
    ``ALL_KEY``). Store errors propagate."""
    store.set(join_key(rank), node_name)
    if int(store.add(COUNT_KEY, 1)) == world_size:
        store.set(ALL_KEY, "1")
        return True
    return False


#: how often a main thread waiting in :func:`_interruptible` looks for a signal whose handler
#: ran between its last look and its sleep (Python's untimed lock wait then sleeps on)
_SIGNAL_LOOK = 0.05


def _interruptible(call: Callable[[], Any]) -> Any:
    """``call()``, run in a helper thread when this is the main thread, so that a SIGINT
    (KeyboardInterrupt) or another Python signal handler is not held up until torch's C++ wait
    returns (it retries when a signal interrupts it). The main thread waits in short slices: a
    signal that lands after Python last ran its handlers and before the thread sleeps (or in
    another thread) does not wake an untimed wait, which then lasted the whole store wait."""
    if threading.current_thread() is not threading.main_thread():
        return call()
    outcome: list[Any] = []
    done = threading.Event()

    def run() -> None:
        try:
            outcome.append((True, call()))
        except BaseException as exc:  # handed to the caller's thread
            outcome.append((False, exc))
        finally:
            done.set()

    # the SIGINT this thread exists for goes to the main thread
    start_shielded(threading.Thread(target=run, name="unirank-join-wait", daemon=True))
    while not done.wait(_SIGNAL_LOOK):
        pass
    ok, value = outcome[0]
    if not ok:
        raise value
    return value


def _wait_all(store: StoreLike, timeout: float, deadline: float) -> bool:
    """Wait for ``ALL_KEY`` until the deadline: True when it came, False when time ran out."""
    try:
        _interruptible(lambda: store.wait(
            [ALL_KEY], timedelta(seconds=max(deadline - time.monotonic(), 0.001))))
        return True
    except (RuntimeError, TimeoutError) as exc:
        _expired(exc, deadline, timeout)
    return False


def _publish(store: StoreLike, missing: list[int]) -> None:
    store.set(RESULT_KEY, "missing:" + ",".join(str(r) for r in missing))


def _await_verdict(store: StoreLike, seconds: float) -> list[int] | None:
    """The published verdict, waiting at most ``seconds`` for it; None when none came (or the
    store could not be read)."""
    try:
        store.wait([RESULT_KEY], timedelta(seconds=seconds))
        verdict = bytes(store.get(RESULT_KEY)).decode()
        return [int(r) for r in verdict.removeprefix("missing:").split(",") if r]
    except (RuntimeError, OSError, TimeoutError, ValueError):
        return None


def _coordinate(
    store: StoreLike,
    *,
    world_size: int,
    timeout: float,
    rank_to_node: Callable[[int], str | None] | None,
    group_start: bool,
) -> None:
    """Rank 0 after its wait ran out: publish the verdict, wait for the others to read it."""
    if _all_came(store, 0, world_size):  # the last rank arrived as the wait ran out
        return
    missing = _missing(store, world_size)
    if missing is not None:
        _publish(store, missing)
    if missing == []:  # every rank has set its key; the last one is about to set ALL_KEY
        return
    # This process may host the store: stay until the ranks that joined have read the verdict.
    absent = set(missing or [])
    joined = [r for r in range(1, world_size) if r not in absent]
    if missing is not None and joined:
        with contextlib.suppress(RuntimeError, TimeoutError):
            store.wait([seen_key(r) for r in joined],
                       timedelta(seconds=min(LINGER, max(timeout, 0.001))))
    raise _timeout_error(missing, rank=0, world_size=world_size, timeout=timeout,
                         rank_to_node=rank_to_node, group_start=group_start)


def _stand_in(store: StoreLike, world_size: int, grace: float) -> list[int] | None:
    """No verdict from rank 0: the first rank to count itself at ``COORDINATOR_KEY`` scans and
    publishes; the others wait at most ``grace`` for that verdict. None: no verdict."""
    try:
        first = int(store.add(COORDINATOR_KEY, 1)) == 1
    except (RuntimeError, OSError):
        return None
    if not first:
        return _await_verdict(store, grace)
    missing = _missing(store, world_size)
    if missing is not None:
        with contextlib.suppress(RuntimeError, OSError):
            _publish(store, missing)
    return missing


def _follow(
    store: StoreLike,
    *,
    rank: int,
    world_size: int,
    timeout: float,
    rank_to_node: Callable[[int], str | None] | None,
    group_start: bool,
) -> None:
    """Any other rank after its wait ran out: take rank 0's verdict, or a stand-in's."""
    if _all_came(store, rank, world_size):
        return
    grace = min(LINGER, max(timeout, 0.001))
    missing: list[int] | None = None
    if _has(store, join_key(0)):  # rank 0 joined: it gives the verdict at its own deadline
        missing = _await_verdict(store, grace)
    if missing is None:
        if _all_came(store, rank, world_size):  # everyone joined while we waited for a verdict
            return
        missing = _stand_in(store, world_size, grace)
    if missing == []:
        return
    if missing is not None:
        with contextlib.suppress(RuntimeError, OSError):
            store.set(seen_key(rank), "1")
    raise _timeout_error(missing, rank=rank, world_size=world_size, timeout=timeout,
                         rank_to_node=rank_to_node, group_start=group_start)


def announce_and_wait(
    store: StoreLike,
    *,
    rank: int,
    world_size: int,
    node_name: str,
    timeout: float,
    rank_to_node: Callable[[int], str | None] | None = None,
    group_start: bool = False,
) -> None:
    """Set ``unirank/join/<rank>`` = ``node_name`` in ``store``, then wait for every rank.

    Returns when all ``world_size`` ranks have joined: each rank counts itself at
    ``unirank/join/count``, the last one sets ``unirank/join/all``, the others wait on that key,
    so each rank makes three store calls of one key each. Raises :class:`InitTimeoutError` when
    they have not after ``timeout`` seconds, naming the missing ranks and (through
    ``rank_to_node``) their nodes. On a timeout rank 0 scans the join keys, publishes which ranks
    are missing (``unirank/join/result``) and, as it usually hosts the store, stays (at most
    10 s) until the ranks that joined have read it (``unirank/join/seen/<rank>``); the others
    take that verdict. When rank 0 never joined (or gave no verdict within ``min(10 s,
    timeout)``) one of the others, elected through ``unirank/join/coordinator``, scans and
    publishes instead; a rank that gets no verdict at all says the store could not tell which
    ranks are missing. Other store errors before the deadline (the store's host went away)
    propagate. A node that gave up (:func:`abort_join`) ends the wait at once with
    :class:`JoinAbortedError`. Each rank must call this once per store (or ``PrefixStore``
    prefix). ``group_start``: the ranks wait at the start of a process group
    (:mod:`unirank.supervisor.worker.groupstart`), which the timeout's message then says.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside the world of {world_size}")
    deadline = time.monotonic() + timeout
    if _join(store, rank=rank, world_size=world_size, node_name=node_name):
        return
    if _wait_all(store, timeout, deadline):
        _aborted(store, rank, world_size)
        return
    if rank == 0:
        _coordinate(store, world_size=world_size, timeout=timeout, rank_to_node=rank_to_node,
                    group_start=group_start)
    else:
        _follow(store, rank=rank, world_size=world_size, timeout=timeout,
                rank_to_node=rank_to_node, group_start=group_start)
