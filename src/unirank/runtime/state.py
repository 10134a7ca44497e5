"""This process's place in the job: the cached :class:`DistEnv` and the getters built on it.

Getters work before :func:`~unirank.runtime.lifecycle.init` (they answer from the detected
launcher) and at world size 1. The launcher's description is detected again whenever the
environment (or ``sys.argv``) changed since, as long as no backend is live: a program that sets
``RANK``/``WORLD_SIZE`` after a first getter and then starts a group gets the world it described.

Once a default process group exists, rank and world size come from ``torch.distributed``
itself, so a group the user created with ``init_process_group`` is honoured. When the launcher's
description does not match that group (a group made by hand, as ignite's own tests make it),
the per-node numbers come from the live group (:mod:`unirank.runtime.layout`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from unirank.distenv import DistEnv
from unirank.elasticstate import ElasticState, read_elastic_state
from unirank.runtime import backends
from unirank.runtime.layout import Layout, group_layout

__all__ = [
    "STATE",
    "active",
    "backend",
    "backend_entry",
    "device",
    "dist_env",
    "elastic_state",
    "get_local_rank",
    "get_local_world_size",
    "get_nnodes",
    "get_node_rank",
    "get_rank",
    "get_world_size",
    "hostname",
    "is_initialized",
    "set_dist_env",
    "torch_group_exists",
]


@dataclass
class RuntimeState:
    """Mutable per-process state of the runtime (one instance: :data:`STATE`)."""

    env: DistEnv | None = None
    #: where ``ur.load_state`` last took the job's state from, in its one line
    #: (:mod:`unirank.runtime.snapshots` sets it); None before any
    state_restored: str | None = None
    #: True while a default process group exists that unirank created (and will destroy)
    owns_group: bool = False
    #: whether :func:`unirank.runtime.lifecycle.init` registered its end at the interpreter's exit
    ends_at_exit: bool = False
    #: stores kept alive while the group that uses them lives
    stores: list[Any] = field(default_factory=list)
    #: how many groups this process has initialised; part of the store key prefix
    generation: int = 0
    #: the live backend when it is not a torch.distributed group (horovod, xla), else None
    active: backends.Backend | None = None
    #: what the environment and ``sys.argv`` were when :attr:`env` was detected; ``None`` when
    #: :attr:`env` was set by :func:`set_dist_env` (kept until replaced)
    env_snapshot: tuple[dict[Any, Any], tuple[str, ...]] | None = None
    #: the local rank given to ``set_local_rank`` (ignite's hint for a group made by hand)
    local_rank_hint: int | None = None


STATE = RuntimeState()


def _snapshot() -> tuple[dict[Any, Any], tuple[str, ...]]:
    """What detection reads: the environment (its raw mapping when CPython has one: a cheap
    comparison) and ``sys.argv``."""
    raw = getattr(os.environ, "_data", None)
    return (dict(raw) if isinstance(raw, dict) else dict(os.environ)), tuple(sys.argv)


def _stale(snapshot: tuple[dict[Any, Any], tuple[str, ...]] | None) -> bool:
    """True when the environment or ``sys.argv`` changed since ``snapshot`` was taken and no
    backend is live (a live group keeps the description it started with)."""
    if snapshot is None or is_initialized():
        return False
    raw = getattr(os.environ, "_data", None)
    environ = raw if isinstance(raw, dict) else dict(os.environ)
    return environ != snapshot[0] or tuple(sys.argv) != snapshot[1]


def dist_env() -> DistEnv:
    """The launcher's description of this process, detected on first use and again whenever
    the environment or ``sys.argv`` changed before a backend started.

    Reads every variable :func:`unirank.launchers.detect` reads (``os.environ``, ``sys.argv``).
    Raises :class:`~unirank.errors.ConfigError` when the launcher's variables are inconsistent.
    """
    env = STATE.env
    if env is None or _stale(STATE.env_snapshot):
        from unirank.launchers import detect

        snapshot = _snapshot()
        env = detect(os.environ, sys.argv)
        STATE.env, STATE.env_snapshot = env, snapshot
    return env


def set_dist_env(env: DistEnv | None) -> None:
    """Replace the cached DistEnv, kept until replaced again (``None`` forgets it, so the next
    call detects again)."""
    STATE.env = env
    STATE.env_snapshot = None


def torch_group_exists() -> bool:
    """True when a default ``torch.distributed`` process group exists (unirank's or the user's)."""
    return dist.is_available() and dist.is_initialized()


def active() -> backends.Backend | None:
    """The live backend of unirank's that is not a torch.distributed group (Horovod, XLA), or
    ``None``. A Horovod the program started itself (``hvd.init()``, as ignite's own tests do) is
    taken as live too, as ignite takes it: unirank neither started nor ends it."""
    if STATE.active is None and not torch_group_exists():
        # a horovod.torch still being imported (by this thread or another) has no
        # is_initialized yet: it is not started
        started = getattr(sys.modules.get("horovod.torch"), "is_initialized", None)
        if callable(started) and started():
            return backends.get("horovod")
    return STATE.active


def is_initialized() -> bool:
    """True when a backend is live: a default ``torch.distributed`` process group (unirank's or
    the user's), or a backend of unirank's that is not one (Horovod, XLA) after ``init``."""
    return active() is not None or torch_group_exists()


def get_rank() -> int:
    """Global rank: from the live backend when there is one, else from the launcher."""
    live = active()
    if live is not None and live.rank_and_size is not None:
        return live.rank_and_size()[0]
    if torch_group_exists():
        return int(dist.get_rank())
    return dist_env().rank


def get_world_size() -> int:
    """Number of processes: from the live backend when there is one, else from the launcher."""
    live = active()
    if live is not None and live.rank_and_size is not None:
        return live.rank_and_size()[1]
    if torch_group_exists():
        return int(dist.get_world_size())
    return dist_env().world_size


def elastic_state(environ: Mapping[str, str] | None = None) -> ElasticState:
    """Whether this run was restarted and why: the restart count and the maximum
    (TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS), the world size now and before,
    and why the attempt before ended (a node lost or joined, a worker failed, the hang
    timeout...; ``unirank run`` says it in UNIRANK_RESTART_REASON). Under torchrun the reason
    is ``unknown``. ``environ``: read this mapping instead of the program's environment (the
    world size then from its WORLD_SIZE). A malformed value is a ConfigError naming it.

    ``state_restored``: where this process's ``ur.load_state`` took the job's state from
    (:func:`unirank.runtime.snapshotload.restored_from`). ``stragglers``: the ranks that keep the
    others waiting now, as the hang detector names them (:mod:`unirank.hang.slowrank`; one
    store read where this rank is not the detector's; ``()`` without a detector).
    ``slow_link``: the node whose link the rendezvous names slow now, as this node's ``unirank
    run`` keeps it (:attr:`unirank.runfolder.RunFolder.slow_link_file`).

    Reads: TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS, UNIRANK_RESTART_REASON, and
    the world size as :func:`get_world_size` (WORLD_SIZE where ``environ`` is given);
    UNIRANK_ATTEMPT_DIR, else TORCHELASTIC_ERROR_FILE (:func:`unirank.runfolder.
    attempt_folder_of`).
    """
    from dataclasses import replace

    from unirank.runfolder import AttemptFolder, attempt_folder_of, read_slow_link

    seen = os.environ if environ is None else environ
    found = read_elastic_state(seen, None if environ is not None else get_world_size())
    from unirank.hang.watcher import running

    watcher = running()
    folder = attempt_folder_of(seen)
    return replace(found, state_restored=STATE.state_restored,
                   stragglers=() if watcher is None else watcher.stragglers(),
                   slow_link=read_slow_link(AttemptFolder(folder).run.slow_link_file)
                   if folder else "")


def _hand_made_layout() -> Layout | None:
    """The per-node numbers of a default group the launcher's description does not describe
    (:func:`unirank.runtime.layout.group_layout`), else ``None``: no group, a group of
    unirank's, a backend of its own (Horovod, XLA), or a group matching the launcher's rank and
    world size. Reads: LOCAL_RANK, SLURM_JOB_ID, SLURM_LOCALID (for a group made by hand)."""
    if STATE.owns_group or active() is not None or not torch_group_exists():
        return None
    env = dist_env()
    if (env.rank, env.world_size) == (int(dist.get_rank()), int(dist.get_world_size())):
        return None
    return group_layout(os.environ, STATE.local_rank_hint)


def get_local_rank() -> int:
    """Rank of this process on its node (a group made by hand: see :func:`_hand_made_layout`;
    no launcher detected: the ``set_local_rank`` hint when one was given)."""
    live = active()
    if live is not None and live.local_rank_and_size is not None:
        return live.local_rank_and_size()[0]
    layout = _hand_made_layout()
    if layout is not None:
        return layout.local_rank
    env = dist_env()
    hint = STATE.local_rank_hint
    return hint if hint is not None and env.launcher == "local" else env.local_rank


def get_local_world_size() -> int:
    """Number of processes on this node."""
    live = active()
    if live is not None and live.local_rank_and_size is not None:
        return live.local_rank_and_size()[1]
    layout = _hand_made_layout()
    return dist_env().local_world_size if layout is None else layout.local_world_size


def get_node_rank() -> int:
    """Index of this node in the job."""
    layout = _hand_made_layout()
    return dist_env().node_rank if layout is None else layout.node_rank


def get_nnodes() -> int:
    """Number of nodes in the job."""
    layout = _hand_made_layout()
    return dist_env().num_nodes if layout is None else layout.num_nodes


def backend() -> str | None:
    """The live backend's name: unirank's Horovod or XLA backend, else the default process
    group's (``"gloo"``, ``"nccl"``...); ``None`` without either."""
    live = active()
    if live is not None:
        return live.name
    if torch_group_exists():
        return str(dist.get_backend())
    return None


def backend_entry() -> backends.Backend | None:
    """The registry entry of the live backend (a plain torch.distributed entry for a backend
    without one of its own), ``None`` without one."""
    live = active()
    if live is not None:
        return live
    name = backend()
    return None if name is None else backends.for_group(name)


def device() -> torch.device:
    """The device this rank computes on: ``cuda:<index>`` or ``cpu``, as the backend's entry says.

    With a process group, its backend's entry (:mod:`~unirank.runtime.backends`) answers: the
    current CUDA device for nccl (which :func:`init` set), else the entry's device rule. Before
    any group, the common rule (:func:`~unirank.runtime.backends.choose_device`) answers.
    Reads: CUDA_VISIBLE_DEVICES (through torch).
    """
    entry = backend_entry()
    if entry is not None and entry.current_device is not None:
        return torch.device(entry.current_device())
    rule = backends.choose_device if entry is None else entry.device
    return torch.device(rule(get_local_rank(), backends.cuda_facts()))


def hostname() -> str:
    """This node's name: the detected :attr:`DistEnv.node_name
    <unirank.distenv.DistEnv.node_name>`, which every launcher names by one rule
    (:func:`unirank.launchers.node_name`: SLURMD_NODENAME, UNIRANK_NODE_NAME, the launcher's own
    name for the node, the host name).

    Reads what :func:`dist_env` reads.
    """
    return dist_env().node_name
