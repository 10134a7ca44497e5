"""The idist-style runtime API (imports torch): ``init``/``finalize``/``Parallel``, getters,
collectives, helpers and training helpers. ``import unirank as ur`` serves these names lazily.

Modules: :mod:`.backends` (the backend registry), :mod:`.state` (the cached DistEnv
and getters), :mod:`.lifecycle` (init/finalize), :mod:`.parallel`
(``Parallel``, which spawns through :mod:`unirank.supervisor.attempts`), :mod:`.collectives`,
:mod:`.helpers`, :mod:`.training` (auto_model, auto_optim, manual_seed, save, load),
:mod:`.data` (auto_dataloader), :mod:`.groups` (new_group, the ``group=`` argument),
:mod:`.idist` (the rest of pytorch-ignite's ``ignite.distributed`` names: initialize, spawn,
model_name, show_config...), :mod:`.layout` (the per-node numbers of a group made by hand),
:mod:`.objects` (objects and strings through byte tensors: no numpy), :mod:`.launchcall`
(``launch``: its options, and ``fn``'s arguments), :mod:`.worker` (the pickled
:class:`~.worker.Call` a spawned worker runs), :mod:`.byvalue` (what goes to it by value),
:mod:`.relay` (its console where the caller's streams are not files), :mod:`.preemption` (stop,
checkpoint, requeue, resume), :mod:`.ignite_options` (ignite's start-up options, pure).
"""

from __future__ import annotations

from typing import Any

from unirank.runtime.collectives import all_gather, all_reduce, barrier, broadcast
from unirank.runtime.data import (
    AutoDataLoader,
    AutoDistributedSampler,
    DistributedProxySampler,
    auto_dataloader,
)
from unirank.runtime.groups import new_group
from unirank.runtime.helpers import get_logger, one_rank_first, one_rank_only, print0
from unirank.runtime.idist import (
    all_gather_tensors_with_shapes,
    available_backends,
    get_nproc_per_node,
    has_native_dist_support,
    initialize,
    model_name,
    set_local_rank,
    show_config,
    spawn,
    sync,
)
from unirank.runtime.launchcall import launch
from unirank.runtime.lifecycle import InitError, finalize, init
from unirank.runtime.parallel import Parallel, WorkerFailedError
from unirank.runtime.preemption import (
    exit_for_requeue,
    stop_requested,
    time_left,
    unwatch_stop_signals,
    watch_stop_signals,
)
from unirank.runtime.snapshotload import load_state, restored_from
from unirank.runtime.snapshots import save_state
from unirank.runtime.state import (
    backend,
    device,
    dist_env,
    elastic_state,
    get_local_rank,
    get_local_world_size,
    get_nnodes,
    get_node_rank,
    get_rank,
    get_world_size,
    hostname,
    is_initialized,
)
from unirank.runtime.training import auto_model, auto_optim, load, manual_seed, save

__all__ = [
    "AutoDataLoader",
    "AutoDistributedSampler",
    "DistributedProxySampler",
    "InitError",
    "Parallel",
    "WorkerFailedError",
    "all_gather",
    "all_gather_tensors_with_shapes",
    "all_reduce",
    "auto_dataloader",
    "auto_model",
    "auto_optim",
    "available_backends",
    "backend",
    "barrier",
    "broadcast",
    "device",
    "dist_env",
    "elastic_state",
    "exit_for_requeue",
    "finalize",
    "get_local_rank",
    "get_local_world_size",
    "get_logger",
    "get_nnodes",
    "get_node_rank",
    "get_nproc_per_node",
    "get_rank",
    "get_world_size",
    "has_hvd_support",
    "has_native_dist_support",
    "has_xla_support",
    "hostname",
    "init",
    "initialize",
    "is_initialized",
    "launch",
    "load",
    "load_state",
    "manual_seed",
    "model_name",
    "new_group",
    "one_rank_first",
    "one_rank_only",
    "print0",
    "restored_from",
    "save",
    "save_state",
    "set_local_rank",
    "show_config",
    "spawn",
    "state_reader",
    "state_writer",
    "stop_requested",
    "sync",
    "time_left",
    "unwatch_stop_signals",
    "watch_stop_signals",
]


def __getattr__(name: str) -> Any:
    """``has_hvd_support`` and ``has_xla_support``, answered on first use by
    :mod:`unirank.runtime.idist` (so that importing the runtime asks CUDA nothing);
    ``state_writer`` and ``state_reader`` from :mod:`unirank.runtime.snapshotdcp` (which
    imports torch.distributed.checkpoint: not at a program's import)."""
    if name in ("state_writer", "state_reader"):
        from unirank.runtime import snapshotdcp

        return getattr(snapshotdcp, name)
    from unirank.runtime import idist

    if name in idist.LAZY_FLAGS:
        return getattr(idist, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
