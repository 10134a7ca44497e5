"""A worker's side of the rendezvous store: host it (rank 0), join every rank, and keep it up
until every rank is done with it.

* rank 0 builds the TCPStore server on the listening socket the supervisor opened
  (UNIRANK_STORE_FD). Every rank, rank 0 included, is a store client
  (TORCHELASTIC_USE_AGENT_STORE=True), as under torchrun. With ``--exec`` rank 0 forks a store
  host instead (:func:`host_store`), which serves until the supervisor ends;
* :func:`rendezvous` has every rank claim its rank for its supervisor (two nodes given the same
  node rank are named at once, and the others told through the store), then announce itself and
  wait for the others (:mod:`unirank.joincheck`), failing within the init timeout with the
  missing ranks named, or at once when a node gave up before joining;
* so that the store outlives every local rank's use of it, rank 0 does not end before its
  node's other workers' programs: at its end it waits (:func:`linger`) until the supervisor
  closes the linger pipe, which it does once every other worker closed its done pipe
  (:func:`done`, when the program ends, before the interpreter's slow teardown) or ended;
* when ranks run under other supervisors too, every rank counts itself out in the store
  (:func:`exit_barrier`) and rank 0 waits, at most the exit timeout, until every rank has.

Failures here are one line on stderr and exit code 1 (:data:`RENDEZVOUS_FAILED`).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import time
from datetime import timedelta
from typing import Any, NoReturn

from unirank.errors import ConfigError
from unirank.signals import SHIELDED
from unirank.store import StoreError, interrupted, open_store
from unirank.storekeys.init import (
    EXIT_ALL_KEY,
    EXIT_COUNT_KEY,
    RANK_CLAIM_PREFIX,
    rank_claim_key,
)
from unirank.supervisor.worker.info import WorkerInfo

__all__ = ["EXIT_ALL_KEY", "EXIT_COUNT_KEY", "RANK_CLAIM_PREFIX", "RENDEZVOUS_FAILED", "connect",
           "done", "exit_barrier", "host_store", "linger", "private_fds", "rendezvous"]

#: exit code of a worker that could not rendezvous (store unreachable, init timeout)
RENDEZVOUS_FAILED = 1
#: the exit barrier's keys (several nodes only) and each rank's claim by its supervisor (node
#: name and pid): unirank.storekeys.init


def _fail(info: WorkerInfo, message: str) -> NoReturn:
    print(f"unirank: rank {info.rank}: {message}", file=sys.stderr, flush=True)
    raise SystemExit(RENDEZVOUS_FAILED)


def _open(info: WorkerInfo) -> Any:
    """This rank's store: the server on rank 0 (``info.store_fd``), else a client."""
    return open_store(
        info.master_addr, info.master_port, rank=info.rank, timeout=info.init_timeout,
        serve=info.store_fd is not None, listen_fd=info.store_fd, served_by="rank 0",
        hint=f"check that node 0 ({info.store_node}) started unirank run with the same "
             f"--master-port, and that this node can reach that address",
    )


def connect(info: WorkerInfo) -> Any:
    """One more client connection to the job's store (the hang watcher's own)."""
    return open_store(info.master_addr, info.master_port, rank=info.rank,
                      timeout=info.init_timeout, served_by="rank 0", hint="")


def _serve_store(info: WorkerInfo, watched: int) -> NoReturn:
    """The store host (a forked child of rank 0): serve the store until ``watched`` (the
    supervisor) is gone. The supervisor kills it with rank 0's process group at its end."""
    try:
        for sig in SHIELDED:
            signal.signal(sig, signal.SIG_IGN)  # forwarded signals are for the program
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        server = _open(info)  # the server owns the listening fd now: never close it here
        try:
            pidfd = os.pidfd_open(watched)
        except (OSError, AttributeError):  # pragma: no cover - Linux < 5.3
            while True:
                signal.pause()
        if os.getppid() == watched or _alive(watched):
            select.select([pidfd], [], [])
        del server
    finally:
        os._exit(0)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover - someone else's pid
        return True
    return True


def host_store(info: WorkerInfo) -> None:
    """Fork the store host on the listening socket the supervisor passed (rank 0 with
    ``--exec``, whose program replaces this process). Not used otherwise: after a fork, both
    processes pay for copying every page Python touches (measured: 60 ms a run)."""
    import torch.distributed  # noqa: F401  (imported before the fork, once)

    assert info.store_fd is not None
    watched = info.supervisor_pid or os.getpid()
    sys.stdout.flush()
    sys.stderr.flush()
    child = os.fork()
    if child == 0:
        _serve_store(info, watched)
    os.close(info.store_fd)


def _claim_rank(store: Any, info: WorkerInfo) -> None:
    """Claim this rank for this node's supervisor (its node name and pid); when another
    supervisor claimed it first (two nodes given the same node rank), tell every waiting rank
    (:func:`unirank.joincheck.abort_join`) and fail naming both."""
    from unirank.joincheck import abort_join

    ours = f"{info.node_name} (pid {info.supervisor_pid or os.getpid()})"
    theirs = bytes(store.compare_set(rank_claim_key(info.rank), "", ours)).decode(
        errors="replace")
    if theirs == ours:
        return
    reason = (f"rank {info.rank} (node rank {info.node_rank}) is claimed by two nodes, "
              f"{theirs} and {ours}. HINT: give every node a distinct --node-rank, 0 to "
              "--nnodes - 1 (or let srun/mpirun give it)")
    with contextlib.suppress(RuntimeError, OSError):
        abort_join(store, reason)
    _fail(info, reason)


def rendezvous(info: WorkerInfo) -> Any:
    """Host the store (rank 0) or connect to it, then wait for every rank to join.

    Returns this rank's store (the server itself on rank 0: keep it alive). On failure (the
    master does not resolve, the store is unreachable, another node claims this rank, a
    node gave up, the init timeout) prints a one-line message and raises SystemExit(1).
    """
    import torch.distributed  # noqa: F401  (before the clock starts: a slow import is no peer's)

    from unirank.joincheck import InitTimeoutError, JoinAbortedError, announce_and_wait

    deadline = time.monotonic() + info.init_timeout
    try:
        store = _open(info)
    except StoreError as exc:
        _fail(info, exc.what)
    except ConfigError as exc:
        _fail(info, str(exc))
    try:
        _claim_rank(store, info)
        announce_and_wait(
            store, rank=info.rank, world_size=info.world_size, node_name=info.node_name,
            timeout=max(0.0, deadline - time.monotonic()), rank_to_node=info.node_of,
        )
    except KeyboardInterrupt:
        interrupted(info.rank, "waiting for the other ranks to join")
    except (InitTimeoutError, JoinAbortedError) as exc:
        _fail(info, str(exc).removeprefix(f"rank {info.rank}: "))
    except (RuntimeError, OSError) as exc:
        detail = " ".join(str(exc).split())[:200]
        _fail(info, f"lost the rendezvous store at {info.master_addr}:{info.master_port} "
              f"(rank 0's node {info.store_node}) while waiting for the other ranks: {detail}")
    return store


def private_fds(info: WorkerInfo) -> None:
    """The supervisor's pipes are not for the program's own children (exec'd or spawned)."""
    for fd in (info.linger_fd, info.done_fd):
        if fd is not None:
            with contextlib.suppress(OSError):
                os.set_inheritable(fd, False)


def done(info: WorkerInfo) -> None:
    """Tell the supervisor this worker's program ended (close the done pipe)."""
    if info.done_fd is not None:
        with contextlib.suppress(OSError):
            os.close(info.done_fd)


def linger(info: WorkerInfo) -> None:
    """Rank 0 at the end of its program: wait until the supervisor closed the linger pipe (its
    node's other workers have ended, or it is gone), so the store this process serves outlives
    their use of it."""
    if info.linger_fd is None:
        return
    with contextlib.suppress(OSError):
        while os.read(info.linger_fd, 4096):
            pass


def exit_barrier(store: Any, info: WorkerInfo, *, wait: bool) -> None:
    """Count this rank out; with ``wait`` (rank 0, whose node hosts the store), wait until
    every rank has, at most ``info.exit_timeout`` seconds. Never raises."""
    with contextlib.suppress(Exception):
        if int(store.add(EXIT_COUNT_KEY, 1)) >= info.world_size:
            store.set(EXIT_ALL_KEY, "1")
        if wait and info.exit_timeout:
            store.wait([EXIT_ALL_KEY], timedelta(seconds=info.exit_timeout))
