"""The xla-tpu backend (alias ``xla``): torch_xla devices (TPUs; XLA:CPU at world size 1).

Selected by ``backend="xla-tpu"`` (ignite's name) or ``"xla"``; ``auto`` never picks it. It needs
torch_xla, which pins its own torch (torch_xla 2.9.0 needs torch 2.9.0): ``scripts/setup --xla``
makes ``.venv-xla`` with both. While it is live:

* the device is ``torch_xla.device()`` (``xla:0``...), and rank and size are torch_xla's
  (``xr.global_ordinal()``, ``xr.world_size()``);
* collectives map to ``xm.*``: ``all_reduce`` to ``xm.all_reduce`` (MEAN: SUM scaled by
  1/world), ``all_gather`` to ``xm.all_gather``, ``broadcast`` to ``xm.collective_broadcast``,
  ``barrier`` to ``xm.rendezvous``; objects travel as pickled byte tensors. At world size 1 they
  return at once;
* ``auto_model`` moves the model to the XLA device without DDP (and broadcasts rank 0's
  parameters at a world larger than 1); ``auto_optim`` makes ``step()`` go through
  ``xm.optimizer_step`` (the gradient all-reduce across XLA devices, then the step, then
  ``mark_step``); ``auto_dataloader`` feeds batches through torch_xla's parallel loader
  (``MpDeviceLoader``), attributes (``sampler``, ``dataset``...) still answering;
* ``Parallel(backend="xla-tpu", nproc_per_node=N)`` starts workers with torch_xla's own
  launcher (``xmp.spawn``), as ignite does.

More than one XLA process on the CPU (``PJRT_DEVICE=CPU``) is refused at once with a
:class:`~unirank.errors.ConfigError`: collectives between XLA:CPU devices are not supported
upstream (pytorch/xla#9089; they abort after 10 s in XLA's rendezvous). Only world size 1 on
XLA:CPU was exercised by unirank's tests; the multi-process paths (TPU) were not.

Reads: PJRT_DEVICE (the XLA device type; asked from torch_xla when unset).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import pickle
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from unirank.errors import ConfigError
from unirank.runtime.backends.base import Backend
from unirank.runtime.backends.facts import CudaFacts

__all__ = ["BACKEND", "XlaDeviceLoader", "check_world", "device_type", "spawn"]

UPSTREAM_ISSUE = "https://github.com/pytorch/xla/issues/9089"
HINT = ("run scripts/setup --xla and use .venv-xla/bin/python "
        "(torch_xla 2.9.0 needs its own environment with torch 2.9.0)")


def device_type(environ: Mapping[str, str] | None = None) -> str:
    """The XLA device type: ``PJRT_DEVICE`` of ``environ`` (default ``os.environ``) when set
    (upper case), else torch_xla's answer.

    Reads: PJRT_DEVICE.
    """
    named = (os.environ if environ is None else environ).get("PJRT_DEVICE", "").strip().upper()
    if named:
        return named
    import torch_xla.runtime as xr

    return str(xr.device_type()).upper()


def check_world(world_size: int, environ: Mapping[str, str] | None = None) -> None:
    """Raise ConfigError when ``world_size`` XLA processes cannot work here (more than one on
    XLA:CPU, pytorch/xla#9089). ``environ`` defaults to ``os.environ``. Reads: PJRT_DEVICE."""
    environ = os.environ if environ is None else environ
    if world_size > 1 and device_type(environ) == "CPU":
        raise ConfigError(
            f"asks for {world_size} XLA processes on the CPU, but collectives between XLA:CPU "
            f"devices are not supported by torch_xla ({UPSTREAM_ISSUE}; they abort after 10 s)",
            variable="PJRT_DEVICE", value=environ.get("PJRT_DEVICE", "CPU"),
            hint="use one process on the CPU (no --nproc_per_node), or run on TPUs "
            "(PJRT_DEVICE=TPU), where several processes work",
        )


def _runtime() -> Any:
    import torch_xla.runtime as xr

    return xr


def rank_and_size() -> tuple[int, int]:
    """torch_xla's global ordinal and world size."""
    xr = _runtime()
    return int(xr.global_ordinal()), int(xr.world_size())


def init(*, rank: int, world_size: int, store: Any, timeout: float | None, device: str) -> None:
    """Check the world can run here, then start torch_xla (and, at a world larger than 1, the
    ``xla`` torch.distributed group through ``xla://``). That torch_xla is installed was checked
    before, by :func:`problem` (the registry's choice). Reads: PJRT_DEVICE."""
    check_world(world_size)
    import torch_xla

    torch_xla.device()  # starts the PJRT client: a broken runtime fails here, not mid-training
    if world_size > 1:
        import torch.distributed as dist
        import torch_xla.distributed.xla_backend

        dist.init_process_group("xla", init_method="xla://")


def finalize() -> None:
    """End the ``xla`` torch.distributed group when init started one."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def current_device() -> str:
    """This process's XLA device (``xla:0``...)."""
    import torch_xla

    return str(torch_xla.device())


def problem(facts: CudaFacts) -> str | None:
    """Why XLA cannot run here, or None (torch_xla is installed)."""
    if importlib.util.find_spec("torch_xla") is None:
        return "needs torch_xla, which is not installed in this Python"
    return None


def _world() -> int:
    return rank_and_size()[1]


def _on_xla(tensor: Any) -> tuple[Any, Callable[[Any], Any]]:
    """``tensor`` on the XLA device, and how to put a result back where ``tensor`` was."""
    if tensor.device.type == "xla":
        return tensor, lambda result: result
    moved = tensor.to(current_device())
    return moved, lambda result: tensor.copy_(result.to(tensor.device))


def _pickled(obj: Any) -> Any:
    import torch

    return torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)


class XlaCollectives:
    """unirank's collectives on torch_xla (see :class:`~unirank.runtime.backends.Collectives`)."""

    def all_reduce(self, tensor: Any, op: str) -> Any:
        if _world() == 1:
            return tensor
        import torch_xla.core.xla_model as xm

        kinds = {"SUM": xm.REDUCE_SUM, "MEAN": xm.REDUCE_SUM, "MIN": xm.REDUCE_MIN,
                 "MAX": xm.REDUCE_MAX, "PRODUCT": xm.REDUCE_MUL}
        scale = 1.0 / _world() if op == "MEAN" else 1.0
        on_xla, back = _on_xla(tensor)
        xm.all_reduce(kinds[op], [on_xla], scale=scale)
        back(on_xla)
        return tensor

    def all_gather(self, tensor: Any) -> Any:
        if _world() == 1:
            return tensor
        import torch_xla.core.xla_model as xm

        on_xla, _ = _on_xla(tensor)
        return xm.all_gather(on_xla, dim=0).to(tensor.device)

    def all_gather_object(self, obj: Any) -> list[Any]:
        if _world() == 1:
            return [obj]
        import torch

        payload = _pickled(obj)
        sizes = self.all_gather(torch.tensor([payload.numel()], dtype=torch.int64))
        longest = int(sizes.max())
        padded = torch.zeros(longest, dtype=torch.uint8)
        padded[: payload.numel()] = payload
        rows = self.all_gather(padded.unsqueeze(0))
        return [pickle.loads(bytes(rows[i, : int(sizes[i])].tolist()))
                for i in range(rows.shape[0])]

    def broadcast(self, tensor: Any, src: int) -> Any:
        if _world() == 1:
            return tensor
        import torch_xla.core.xla_model as xm

        on_xla, back = _on_xla(tensor)
        xm.collective_broadcast([on_xla], root_ordinal=src)
        back(on_xla)
        return tensor

    def broadcast_object(self, obj: Any, src: int) -> Any:
        if _world() == 1:
            return obj
        import torch

        mine = rank_and_size()[0] == src
        payload = _pickled(obj) if mine else torch.zeros(0, dtype=torch.uint8)
        size = self.broadcast(torch.tensor([payload.numel()], dtype=torch.int64), src)
        buffer = payload if mine else torch.zeros(int(size), dtype=torch.uint8)
        self.broadcast(buffer, src)
        return obj if mine else pickle.loads(bytes(buffer.tolist()))

    def barrier(self) -> None:
        if _world() > 1:
            import torch_xla.core.xla_model as xm

            xm.rendezvous("unirank.barrier")


def wrap_model(model: Any, *, sync_bn: bool, **kwargs: Any) -> Any:
    """The model (already on the XLA device), not wrapped; rank 0's parameters are broadcast at
    a world larger than 1. ``sync_bn=True`` there is a ConfigError (torch's SyncBatchNorm does
    not run on XLA tensors); DDP keyword arguments do not apply and are ignored."""
    if _world() > 1:
        if sync_bn:
            raise ConfigError("is not supported with the xla-tpu backend", variable="sync_bn",
                              value="True", hint="pass sync_bn=False")
        import torch_xla.core.xla_model as xm

        xm.broadcast_master_param(model)
    return model


class _BaseStep:
    """What ``xm.optimizer_step`` needs of an optimizer: its groups and the original step."""

    def __init__(self, optimizer: Any, base_step: Callable[..., Any]) -> None:
        self.param_groups = optimizer.param_groups
        self._base_step = base_step

    def step(self, **kwargs: Any) -> Any:
        return self._base_step(**kwargs)


@functools.cache
def _xla_class(base: Any) -> type:
    """``base`` with a ``step`` that goes through ``xm.optimizer_step`` (one class per base)."""

    def step(self: Any, closure: Callable[[], Any] | None = None) -> Any:
        import torch_xla.core.xla_model as xm

        arguments = {} if closure is None else {"closure": closure}
        stepper = _BaseStep(self, functools.partial(base.step, self))
        return xm.optimizer_step(stepper, barrier=True, optimizer_args=arguments)

    return type(base.__name__, (base,), {"step": step, "__module__": base.__module__,
                                         "__qualname__": base.__qualname__,
                                         "_unirank_xla": True})


def wrap_optimizer(optimizer: Any, **kwargs: Any) -> Any:
    """The same optimizer object, whose ``step()`` now reduces the gradients across XLA devices
    and marks the step (``xm.optimizer_step(..., barrier=True)``). Its state, groups and
    ``state_dict`` are unchanged; create LR schedulers after ``auto_optim``, as with Horovod."""
    base: Any = type(optimizer)
    if getattr(base, "_unirank_xla", False):
        return optimizer
    optimizer.__class__ = _xla_class(base)
    return optimizer


class XlaDeviceLoader:
    """A DataLoader whose batches arrive on the XLA device through torch_xla's
    ``MpDeviceLoader``; every other attribute (``sampler``, ``dataset``, ``batch_size``...) is
    the DataLoader's."""

    def __init__(self, loader: Any) -> None:
        import torch_xla
        import torch_xla.distributed.parallel_loader as pl

        self.loader = loader
        self._device_loader = pl.MpDeviceLoader(loader, torch_xla.device())

    def __iter__(self) -> Iterator[Any]:
        return iter(self._device_loader)

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:
        if name in ("loader", "_device_loader"):
            raise AttributeError(name)
        return getattr(self.loader, name)


def _worker(index: int, target: Callable[[int], None]) -> None:
    """An ``xmp.spawn`` process: unirank's view of it comes from torch_xla, then ``target``."""
    from unirank.distenv import DistEnv
    from unirank.runtime import state

    xr = _runtime()
    state.set_dist_env(DistEnv(
        launcher="xla", rank=int(xr.global_ordinal()), local_rank=int(xr.local_ordinal()),
        world_size=int(xr.world_size()), local_world_size=int(xr.local_process_count()),
        node_name=state.hostname(), sources={"rank": "torch_xla.runtime"},
    ))
    target(index)


def spawn(nprocs: int, target: Callable[[int], None]) -> None:
    """Run ``target(local_rank)`` on ``nprocs`` XLA processes: here when ``nprocs`` is 1, else
    through torch_xla's launcher ``xmp.spawn``, which starts one process per local XLA device
    (PJRT decides how many; ``nprocs`` only says that more than one is wanted). More than one on
    XLA:CPU is refused at once (:func:`check_world`). Reads: PJRT_DEVICE."""
    check_world(nprocs)
    if nprocs == 1:
        target(0)
        return
    import torch_xla.distributed.xla_multiprocessing as xmp

    xmp.spawn(_worker, args=(target,), nprocs=None)


BACKEND = Backend(
    name="xla-tpu",
    aliases=("xla",),
    init=init,
    finalize=finalize,
    problem=problem,
    problem_hint=HINT,
    device=lambda local_rank, facts: "xla",
    current_device=current_device,
    wrap_model=wrap_model,
    wrap_optimizer=wrap_optimizer,
    wrap_loader=XlaDeviceLoader,
    collectives=XlaCollectives(),
    rank_and_size=rank_and_size,
    uses_store=lambda environ: False,
    spawn=spawn,
)
