"""How to start one worker (:class:`WorkerLaunch`: its command line, its place in the plan, its
environment's base and wiring, where its output goes), the worker's command line
(:func:`worker_command`), and what tells the engine that the world changed (:class:`WorldWatch`).

Plain records: nothing here starts a process. Reads no environment variable (the workers'
environments come whole in each :class:`WorkerLaunch`).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from unirank.runfolder import RunFolder
from unirank.supervisor.output import LineCopy
from unirank.supervisor.plan import Plan, Worker
from unirank.supervisor.workerenv import WorkerWiring, worker_environ

__all__ = ["WorkerLaunch", "WorldWatch", "worker_command"]


class WorldWatch(Protocol):
    """What tells the engine that the world changed while the workers run (the dynamic
    rendezvous's helper: a node lost, or one waiting to join)."""

    def fileno(self) -> int:
        """A descriptor that becomes readable when there may be news."""

    def world_change(self) -> str | None:
        """The news, read without blocking: one line saying how the world changed, or None
        (nothing yet)."""

    def keep_at(self, root: RunFolder) -> None:
        """Keep what the rendezvous tells that is no news for the workers in ``root``'s files,
        now and as it changes: the spare nodes waiting to join (``RunFolder.spares_file``: for
        rank 0's detector, ``--on-slow replace``, and ``unirank top``) and the node whose link
        is slow (``RunFolder.slow_link_file``: ``ur.elastic_state()``, ``unirank top``)."""

    def kind(self) -> str | None:
        """The kind of the last news (:mod:`.rdzv.messages`), None where it gave none:
        ``join`` (nodes waiting to join) is a change of membership alone, which spends no
        restart (:mod:`.budget`) and keeps no worker waiting in a collective with a node that
        is gone (:mod:`.stoppolicy`)."""


@dataclass(frozen=True)
class WorkerLaunch:
    """How to start one worker, and where its output goes."""

    rank: int
    local_rank: int
    argv: tuple[str, ...]
    plan: Plan
    worker: Worker
    #: the base of its environment (see :func:`~unirank.supervisor.workerenv.worker_environ`)
    base: Mapping[str, str]
    #: the engine's wiring known before the start; the pipes and the start time come at it
    wiring: WorkerWiring = field(default_factory=WorkerWiring)
    #: ``--timeline``: tell the worker when it was started
    timeline: bool = False
    #: where stdout / stderr go besides the tail: console fd (or None) and log file (or None)
    stdout_console: bool = True
    stderr_console: bool = True
    stdout_file: str | None = None
    stderr_file: str | None = None
    prefix: bytes | None = None
    #: the prefix of stdout's / stderr's console lines when teed (torchrun's ``[default0]:``)
    console_prefixes: tuple[bytes | None, bytes | None] = (None, None)
    #: ``--duplicate-stdout-filters`` / ``--duplicate-stderr-filters``: where lines are copied
    stdout_copy: LineCopy | None = None
    stderr_copy: LineCopy | None = None

    @property
    def target(self) -> tuple[str, ...]:
        """What follows the bootstrap on the command line (see :func:`worker_command`)."""
        return self.argv[len(worker_command(())):]

    @property
    def error_file(self) -> str | None:
        """Where the worker records its failure."""
        return self.wiring.error_file

    @property
    def fault_file(self) -> str | None:
        """Where the worker's faulthandler writes a fatal signal's stack."""
        return self.wiring.fault_file

    @property
    def hosts_store(self) -> bool:
        """This worker hosts the store: it gets the read end of the linger pipe."""
        return self.wiring.store_fd is not None

    def environ(self, *, linger_fd: int | None, done_fd: int | None,
                started: float) -> dict[str, str]:
        """The worker's complete environment, once its pipes exist (``started``: now)."""
        wiring = replace(self.wiring, linger_fd=linger_fd, done_fd=done_fd,
                         timeline_start=started if self.timeline else None)
        return worker_environ(self.plan, self.worker, self.base, wiring)


def worker_command(target: Sequence[str], python: str | None = None) -> tuple[str, ...]:
    """The command line of a worker: the bootstrap, then ``SCRIPT ARGS``, ``-m MODULE ARGS``,
    ``--exec PROGRAM ARGS`` (``--no-python``) or ``--call FILE`` (``Parallel``)."""
    return (python or sys.executable, "-m", "unirank.supervisor.worker.bootstrap", *target)
