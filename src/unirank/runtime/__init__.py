"""The idist-style runtime API (imports torch): ``init``/``finalize``/``Parallel``, getters,
collectives and helpers. ``import unirank as ur`` serves these names lazily.

Modules: :mod:`.backend` (backend and device choice, pure), :mod:`.state` (the cached DistEnv
and getters), :mod:`.lifecycle` (init/finalize), :mod:`.parallel`
(``Parallel``, which spawns through :mod:`unirank.supervisor.procs`), :mod:`.collectives`,
:mod:`.helpers`.
"""

from __future__ import annotations

from unirank.runtime.collectives import all_gather, all_reduce, barrier, broadcast
from unirank.runtime.helpers import get_logger, one_rank_first, one_rank_only, print0
from unirank.runtime.lifecycle import InitError, finalize, init
from unirank.runtime.parallel import Parallel, WorkerFailedError
from unirank.runtime.state import (
    backend,
    device,
    dist_env,
    get_local_rank,
    get_local_world_size,
    get_nnodes,
    get_node_rank,
    get_rank,
    get_world_size,
    hostname,
    is_initialized,
)

__all__ = [
    "InitError",
    "Parallel",
    "WorkerFailedError",
    "all_gather",
    "all_reduce",
    "backend",
    "barrier",
    "broadcast",
    "device",
    "dist_env",
    "finalize",
    "get_local_rank",
    "get_local_world_size",
    "get_logger",
    "get_nnodes",
    "get_node_rank",
    "get_rank",
    "get_world_size",
    "hostname",
    "init",
    "is_initialized",
    "one_rank_first",
    "one_rank_only",
    "print0",
]
