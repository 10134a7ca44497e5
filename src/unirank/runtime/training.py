"""idist-style training helpers: model, optimizer, seeds, checkpoints (pytorch-ignite's meaning).

* :func:`auto_model` moves a model to :func:`~unirank.runtime.state.device` and, when the world
  is larger than 1, wraps it in ``DistributedDataParallel``;
* :func:`auto_optim` returns the optimizer the backend needs (unchanged for gloo and nccl);
* :func:`manual_seed` seeds ``random``, numpy (when installed) and torch, optionally per rank;
* :func:`save` writes a checkpoint once (rank 0, atomically) and every rank sees it after the
  call; :func:`load` reads it onto this rank's device.

``auto_model`` and ``auto_optim`` ask the live group's backend entry first: its ``wrap_model`` /
``wrap_optimizer`` hooks (:class:`~unirank.runtime.backends.Backend`) replace the generic step,
so that a Horovod or XLA entry changes them without touching this module. The data loader
helper lives in :mod:`unirank.runtime.data`.

Environment variables read: those the getters read without a process group (the launcher's,
through :func:`~unirank.runtime.state.dist_env`) and CUDA_VISIBLE_DEVICES (through torch).
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import uuid
from typing import Any, cast

import torch
from torch.nn.parallel import DataParallel, DistributedDataParallel

from unirank.errors import ConfigError
from unirank.runtime import state
from unirank.runtime.collectives import broadcast

__all__ = ["auto_model", "auto_optim", "load", "manual_seed", "save"]

#: models already wrapped for data parallelism: auto_model returns them as they are
WRAPPED_MODELS = (DistributedDataParallel, DataParallel)
#: device types whose tensors SyncBatchNorm can synchronise (torch's own list, less PrivateUse1)
SYNC_BN_DEVICE_TYPES = ("cuda", "hpu", "xpu")


def _sync_bn_runs_on(where: torch.device) -> bool:
    privateuse1 = getattr(torch._C, "_get_privateuse1_backend_name", lambda: "privateuseone")()
    return where.type in (*SYNC_BN_DEVICE_TYPES, privateuse1)


def auto_model(model: torch.nn.Module, sync_bn: bool = False, **ddp_kwargs: Any) -> torch.nn.Module:
    """``model`` ready for this world: on :func:`~unirank.runtime.state.device`, and wrapped in
    ``DistributedDataParallel`` when the world is larger than 1.

    * A model already wrapped (``DistributedDataParallel`` or ``DataParallel``) is returned as
      it is.
    * Otherwise it is moved to the rank's device (``model.to(device)``). At world size 1 that is
      all: the same module comes back, not wrapped.
    * When the world is larger than 1: with ``sync_bn=True`` its BatchNorm layers become
      ``SyncBatchNorm`` first; then it is wrapped in ``DistributedDataParallel(model,
      **ddp_kwargs)``, with ``device_ids=[device index]`` on CUDA (unless given) and none on CPU.
      A process group must exist (``ur.init()``, or code run by ``ur.Parallel``); without one it
      is a RuntimeError.
    * ``sync_bn=True`` on CPU with a world larger than 1 is a :class:`ConfigError`: torch's
      SyncBatchNorm cannot run forward on CPU tensors (it raises at the first training step),
      and silently keeping per-rank batch statistics would change what the script computes.
      At world size 1 ``sync_bn`` is ignored (there is nothing to synchronise).

    When the backend's entry has a ``wrap_model`` hook (Horovod, XLA...), the hook replaces the
    last two points: it gets the moved model, ``sync_bn`` and ``ddp_kwargs``.

    Reads: the launcher's variables without a process group; CUDA_VISIBLE_DEVICES (through torch).
    """
    if isinstance(model, WRAPPED_MODELS):
        return model
    where = state.device()
    model = model.to(where)
    entry = state.backend_entry()
    if entry is not None and entry.wrap_model is not None:
        return cast(torch.nn.Module, entry.wrap_model(model, sync_bn=sync_bn, **ddp_kwargs))
    world = state.get_world_size()
    if world == 1:
        return model
    if not state.is_initialized():
        raise RuntimeError(
            f"auto_model needs a process group to wrap the model for {world} processes: "
            "call ur.init() first (or run the code through ur.Parallel)"
        )
    if sync_bn:
        if not _sync_bn_runs_on(where):
            raise ConfigError(
                f"SyncBatchNorm cannot run on {where.type} tensors in torch (SyncBatchNorm layers "
                "only work with GPU modules)",
                variable="sync_bn",
                value="True",
                hint="pass sync_bn=False on CPU (each rank keeps its own batch statistics), "
                "or train on GPUs",
            )
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)  # type: ignore[no-untyped-call]
    if where.type == "cuda":
        index = where.index if where.index is not None else torch.cuda.current_device()
        ddp_kwargs.setdefault("device_ids", [index])
    return DistributedDataParallel(model, **ddp_kwargs)


def auto_optim(optimizer: torch.optim.Optimizer, **kwargs: Any) -> torch.optim.Optimizer:
    """The optimizer this backend needs: ``optimizer`` itself for gloo, nccl and the other
    torch.distributed backends (DistributedDataParallel already averages the gradients).

    A backend entry with a ``wrap_optimizer`` hook (Horovod's DistributedOptimizer, XLA's
    optimizer step) returns its own; ``kwargs`` go to that hook and are ignored otherwise, so
    one script runs unchanged under every backend.

    Reads: nothing (the backend comes from the live process group).
    """
    entry = state.backend_entry()
    if entry is not None and entry.wrap_optimizer is not None:
        return cast(torch.optim.Optimizer, entry.wrap_optimizer(optimizer, **kwargs))
    return optimizer


def manual_seed(seed: int, per_rank: bool = False) -> int:
    """Seed python's ``random``, numpy's global generator (when numpy is installed) and torch
    (``torch.manual_seed``, which seeds every CUDA device too); return the seed used.

    With ``per_rank=True`` the global rank is added to ``seed`` (different random streams per
    rank, e.g. for data augmentation); by default every rank gets the same seed (identical
    initial weights). numpy takes the seed modulo 2**32.

    Reads: the launcher's variables without a process group (for the rank, when ``per_rank``).
    """
    value = seed + state.get_rank() if per_rank else seed
    random.seed(value)
    try:
        import numpy
    except ImportError:
        pass
    else:
        numpy.random.seed(value % 2**32)
    torch.manual_seed(value)
    return value


def _write_atomically(obj: Any, target: str) -> None:
    """``torch.save`` to a temporary file next to ``target``, then rename it over ``target``."""
    folder, name = os.path.split(os.path.abspath(target))
    if not os.path.isdir(folder):
        raise FileNotFoundError(errno.ENOENT, "no such folder to save into", folder)
    temporary = os.path.join(folder, f".{name}.{uuid.uuid4().hex}.tmp")
    # os.open honours the umask, as a plain open would for the final file (mkstemp: 0600)
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as handle:
            torch.save(obj, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


def save(obj: Any, path: str | os.PathLike[str]) -> None:
    """Write ``obj`` to ``path`` once: global rank 0 ``torch.save``\\ s it atomically (to a
    temporary file in the same folder, then ``os.replace``), so a reader never sees half a file.

    Every rank must call it (the other ranks' ``obj`` is ignored). With a process group, every
    rank waits for rank 0's outcome (a broadcast, which is also a barrier): when the call
    returns the file is there for every rank; if rank 0 failed, rank 0 raises its error and the
    others a RuntimeError naming it. Without a process group nothing waits.

    Reads: the launcher's variables without a process group (for the rank).
    """
    target = os.fspath(path)
    error: BaseException | None = None
    failure = ""  # rank 0's error, "" for none
    if state.get_rank() == 0:
        try:
            _write_atomically(obj, target)
        except Exception as exc:
            error, failure = exc, f"{type(exc).__name__}: {exc}"
    failure = broadcast(failure, src=0)
    if error is not None:
        raise error
    if failure:
        raise RuntimeError(f"rank 0 could not save {target}: {failure}")


def load(path: str | os.PathLike[str], **kwargs: Any) -> Any:
    """``torch.load(path, map_location=ur.device(), **kwargs)`` on every rank.

    ``weights_only`` is torch's default (True since torch 2.6): tensors, state dicts, optimizer
    states and plain containers load; an arbitrary pickled object needs ``weights_only=False``
    (only for files you trust). ``map_location`` may be given to override the device.

    Reads: CUDA_VISIBLE_DEVICES (through torch) and, without a process group, the launcher's
    variables (for the device).
    """
    kwargs.setdefault("map_location", state.device())
    return torch.load(path, **kwargs)
