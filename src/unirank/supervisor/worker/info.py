"""What a worker's bootstrap knows about its worker: read once from the environment the
supervisor gave it (see :mod:`..workerenv`), then passed around as a value."""

from __future__ import annotations

import contextlib
import functools
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from unirank.contract import (
    DONE_FD_VAR,
    EXIT_TIMEOUT_VAR,
    FAULT_FILE_VAR,
    LINGER_FD_VAR,
    NODE_NAME_VAR,
    NODE_NAMES_VAR,
    RANKS_PER_NODE_VAR,
    STORE_FD_VAR,
    SUPERVISOR_PID_VAR,
    TIMELINE_FILE_VAR,
    TIMELINE_VAR,
    HangSettings,
    parse_seconds,
    resolve_hang,
    resolve_init_timeout,
)
from unirank.envvars import read_int, read_optional_int
from unirank.errors import ConfigError

__all__ = ["WorkerInfo", "read_worker_info"]

_NO_HANG = HangSettings(report_after=None)


@dataclass(frozen=True)
class WorkerInfo:
    """The worker's place, its rendezvous settings and the supervisor's wiring."""

    rank: int
    world_size: int
    node_rank: int
    master_addr: str
    master_port: int
    node_name: str
    #: the nodes in node-rank order, as a compressed host list (expanded only to name a node)
    node_names: str
    #: the ranks on each node in node-rank order, as Slurm's task counts (``2,1``; empty: not
    #: known): expanded only to name a node
    ranks_per_node: str
    init_timeout: float
    store_fd: int | None
    supervisor_pid: int | None = None
    exit_timeout: float | None = None
    linger_fd: int | None = None
    done_fd: int | None = None
    #: ``--timeline``: when the supervisor started this worker (None: off)
    timeline_start: float | None = None
    #: rank 0: where to write every rank's gathered end-of-run record (timeline, collectives)
    timeline_file: str = ""
    #: where faulthandler writes the stack of a fatal signal ("": nowhere; see :mod:`.faults`)
    fault_file: str = ""
    #: the hang detector's settings (see :mod:`unirank.hang`)
    hang: HangSettings = _NO_HANG

    def node_of(self, rank: int) -> str | None:
        """The node that runs ``rank``, by the plan's placement
        (:func:`unirank.supervisor.plan.node_index_of`), named as :meth:`node_called` does;
        None where the plan did not know where the other ranks run."""
        if rank == self.rank:
            return self.node_name
        from unirank.supervisor.plan import node_index_of

        node = node_index_of(rank, _expand(self.node_names, self.ranks_per_node)[1])
        return None if node is None else self.node_called(node)

    def node_called(self, node: int) -> str:
        """Node rank ``node``'s host name where known, else ``node rank N``."""
        if node == self.node_rank and self.node_name:
            return self.node_name
        names = _expand(self.node_names, self.ranks_per_node)[0]
        return names[node] if 0 <= node < len(names) else f"node rank {node}"

    @property
    def store_node(self) -> str:
        """The node that hosts the rendezvous store: node rank 0, where rank 0 runs."""
        return self.node_called(0)


@functools.lru_cache(maxsize=1)
def _expand(node_names: str, ranks_per_node: str) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """The node names and the ranks on each node, from their compressed forms (on the failure
    path only); either one empty where it is missing or malformed."""
    from unirank.hostlist import expand, expand_tasks_per_node

    names: tuple[str, ...] = ()
    counts: tuple[int, ...] = ()
    with contextlib.suppress(ConfigError):
        names = tuple(expand(node_names)) if node_names else ()
    with contextlib.suppress(ConfigError):
        counts = tuple(expand_tasks_per_node(ranks_per_node)) if ranks_per_node else ()
    return names, counts


def _required_text(environ: Mapping[str, str], name: str) -> str:
    value = environ.get(name, "").strip()
    if not value:
        raise ConfigError(f"{name} is not set", hint="start workers with unirank run")
    return value


def _required(environ: Mapping[str, str], name: str) -> int:
    _required_text(environ, name)
    return read_int(environ, name)


def _fd(environ: Mapping[str, str], name: str) -> int | None:
    return read_optional_int(environ, name) if environ.get(name, "").strip() else None


def _read(environ: Mapping[str, str]) -> WorkerInfo:
    exit_text = environ.get(EXIT_TIMEOUT_VAR, "")
    timeline = environ.get(TIMELINE_VAR, "")
    return WorkerInfo(
        rank=_required(environ, "RANK"),
        world_size=_required(environ, "WORLD_SIZE"),
        node_rank=read_optional_int(environ, "GROUP_RANK") or 0,
        master_addr=_required_text(environ, "MASTER_ADDR"),
        master_port=_required(environ, "MASTER_PORT"),
        node_name=environ.get(NODE_NAME_VAR) or socket.gethostname(),
        node_names=environ.get(NODE_NAMES_VAR, ""),
        ranks_per_node=environ.get(RANKS_PER_NODE_VAR, ""),
        init_timeout=resolve_init_timeout(None, environ),
        store_fd=_fd(environ, STORE_FD_VAR),
        supervisor_pid=_fd(environ, SUPERVISOR_PID_VAR),
        exit_timeout=parse_seconds(exit_text, EXIT_TIMEOUT_VAR) if exit_text else None,
        linger_fd=_fd(environ, LINGER_FD_VAR),
        done_fd=_fd(environ, DONE_FD_VAR),
        timeline_start=parse_seconds(timeline, TIMELINE_VAR) if timeline else None,
        timeline_file=environ.get(TIMELINE_FILE_VAR, ""),
        fault_file=environ.get(FAULT_FILE_VAR, ""),
        hang=resolve_hang(None, None, environ),
    )


def read_worker_info(environ: Mapping[str, str]) -> WorkerInfo:
    """The worker's place, rendezvous settings and wiring; a bad or missing value is a one-line
    ``SystemExit`` ("unirank bootstrap: VAR=...: what HINT: do").

    Reads: RANK, WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT,
    UNIRANK_NODE_NAME, UNIRANK_NODE_NAMES, UNIRANK_RANKS_PER_NODE, UNIRANK_INIT_TIMEOUT,
    UNIRANK_STORE_FD, UNIRANK_SUPERVISOR_PID, UNIRANK_EXIT_TIMEOUT, UNIRANK_LINGER_FD,
    UNIRANK_DONE_FD, UNIRANK_TIMELINE, UNIRANK_TIMELINE_FILE, UNIRANK_FAULT_FILE,
    UNIRANK_HANG_REPORT_AFTER, UNIRANK_HANG_TIMEOUT, UNIRANK_HANG_INTERVAL.
    """
    try:
        return _read(environ)
    except ConfigError as exc:
        raise SystemExit(f"unirank bootstrap: {exc}") from None
