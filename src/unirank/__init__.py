"""unirank: one PyTorch distributed script, unchanged, under any launcher.

``import unirank`` does not import torch; the runtime API (``init``, ``Parallel``, collectives,
``auto_model``/``auto_dataloader``...) loads it on first use. Every public name of
pytorch-ignite's ``ignite.distributed`` is here too: ``import unirank as idist`` (docs/ignite.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from unirank.errors import ConfigError

__version__ = "0.1.0"

#: names served lazily from ``unirank.runtime`` (which imports torch when first used)
_RUNTIME_NAMES = frozenset(
    {
        "init",
        "finalize",
        "Parallel",
        "launch",
        "InitError",
        "WorkerFailedError",
        "is_initialized",
        "get_rank",
        "get_world_size",
        "get_local_rank",
        "get_local_world_size",
        "get_node_rank",
        "get_nnodes",
        "backend",
        "device",
        "hostname",
        "all_reduce",
        "all_gather",
        "broadcast",
        "barrier",
        "one_rank_only",
        "one_rank_first",
        "print0",
        "get_logger",
        "dist_env",
        "elastic_state",
        "auto_model",
        "auto_optim",
        "auto_dataloader",
        "DistributedProxySampler",
        "AutoDataLoader",
        "AutoDistributedSampler",
        "manual_seed",
        "save",
        "load",
        # a job's state in memory and on disk (runtime/snapshots.py)
        "save_state",
        "load_state",
        "restored_from",
        "state_writer",  # the same tiers as DCP storage (runtime/snapshotdcp.py)
        "state_reader",
        # stop -> checkpoint -> requeue (runtime/preemption.py)
        "stop_requested",
        "time_left",
        "exit_for_requeue",
        "watch_stop_signals",
        "unwatch_stop_signals",
        # the rest of pytorch-ignite's ignite.distributed names (runtime/idist.py, groups.py)
        "initialize",
        "spawn",
        "sync",
        "model_name",
        "available_backends",
        "show_config",
        "get_nproc_per_node",
        "set_local_rank",
        "new_group",
        "all_gather_tensors_with_shapes",
        "has_native_dist_support",
        "has_hvd_support",
        "has_xla_support",
    }
)

if TYPE_CHECKING:  # pragma: no cover
    from unirank.distenv import DistEnv
    from unirank.hang.phases import phase
    from unirank.launchers import detect
    from unirank.runtime import *  # noqa: F403


def __getattr__(name: str) -> Any:
    if name in _RUNTIME_NAMES:
        import unirank.runtime as runtime

        return getattr(runtime, name)
    if name == "phase":  # no torch: the hang watcher's phases (hang/phases.py)
        from unirank.hang.phases import phase

        return phase
    if name == "detect":
        from unirank.launchers import detect

        return detect
    if name == "DistEnv":  # served lazily too: a worker forked or bootstrapped starts faster
        from unirank.distenv import DistEnv

        return DistEnv
    raise AttributeError(f"module 'unirank' has no attribute {name!r}")


__all__ = ["ConfigError", "DistEnv", "__version__", "detect", "phase", *sorted(_RUNTIME_NAMES)]


def __dir__() -> list[str]:
    """The public names only (not this module's imports nor its submodules)."""
    return sorted(__all__)
