"""The horovod backend: Horovod's collectives (gloo controller on CPUs, NCCL with a GPU build).

Selected by ``backend="horovod"``, and by ``auto`` under horovodrun (its ``launchers``). Horovod
is not a torch.distributed group: while it is live, unirank's collectives map to Horovod's
(``all_reduce`` to ``allreduce_`` with Sum/Average/Min/Max/Product, ``all_gather`` to
``allgather``/``allgather_object``, ``broadcast`` to ``broadcast_``/``broadcast_object``,
``barrier`` to ``barrier``) and the rank and size are ``hvd.rank()``/``hvd.size()``.

Rendezvous:

* under horovodrun (``HOROVOD_GLOO_RENDEZVOUS_ADDR`` is set) Horovod's own: ``hvd.init()`` as is;
* anywhere else unirank knows the ranks (``unirank run``, ``Parallel`` spawning, ``srun``, mpirun,
  torchrun), it provides Horovod's gloo rendezvous itself, with neither horovodrun nor MPI: after
  unirank's own join check on its store, every rank stores its node's name; rank 0 computes
  Horovod's slot plan (:func:`slot_plan`), starts Horovod's HTTP rendezvous server in its own
  process and stores each rank's slot and the server's port; every rank exports the variables
  horovodrun would (:func:`slot_environment`) and calls ``hvd.init()``.

Training hooks: ``auto_model`` broadcasts rank 0's parameters (no DDP: Horovod averages the
gradients in its optimizer; DDP keyword arguments do not apply and are ignored);
``auto_optim`` returns ``hvd.DistributedOptimizer`` (its keyword arguments go there) and
broadcasts rank 0's optimizer state when there is one; ``auto_dataloader`` shards by Horovod's
rank and size (the getters answer from Horovod).

Reads: HOROVOD_GLOO_RENDEZVOUS_ADDR (whether horovodrun brought a rendezvous),
HOROVOD_GLOO_IFACE and GLOO_SOCKET_IFNAME (the network interface; else the one that reaches the
master), HOROVOD_GLOO_TIMEOUT_SECONDS (else the init timeout), SLURMD_NODENAME (the node's name).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from unirank import netroute
from unirank.errors import ConfigError
from unirank.launchers.horovodrun import RENDEZVOUS_ADDR, RENDEZVOUS_PORT
from unirank.runtime.backends.base import Backend, set_cuda_device
from unirank.runtime.backends.facts import CudaFacts
from unirank.storekeys.init import HOROVOD_HOST_PREFIX, HOROVOD_SLOT_PREFIX

__all__ = ["BACKEND", "Slot", "slot_environment", "slot_plan"]

#: the store keys (under unirank's per-init prefix)
HOST_KEY, SLOT_KEY = HOROVOD_HOST_PREFIX, HOROVOD_SLOT_PREFIX

_server: Any = None  # rank 0's Horovod rendezvous server while the backend lives


@dataclass(frozen=True)
class Slot:
    """One rank's place as Horovod's gloo controller sees it (horovodrun's SlotInfo)."""

    hostname: str
    rank: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    size: int


def slot_plan(hosts: Sequence[str]) -> list[Slot]:
    """Horovod's slots for ranks ``0..len(hosts)-1``, ``hosts[r]`` being rank ``r``'s node.

    A rank's local rank is its index among the ranks of its node (in rank order), the local size
    their number; its cross rank is its node's index among the nodes that have that local rank
    (in order of first appearance), the cross size their number. Any rank order works (block or
    cyclic placement).
    """
    size = len(hosts)
    counts: dict[str, int] = {}
    local_ranks: list[int] = []
    for host in hosts:
        local_ranks.append(counts.get(host, 0))
        counts[host] = local_ranks[-1] + 1
    crossing: dict[int, list[str]] = {}
    for host, local_rank in zip(hosts, local_ranks):
        crossing.setdefault(local_rank, []).append(host)
    return [
        Slot(host, rank, local_rank, counts[host], crossing[local_rank].index(host),
             len(crossing[local_rank]), size)
        for rank, (host, local_rank) in enumerate(zip(hosts, local_ranks))
    ]


def slot_environment(slot: Slot, addr: str, port: int, iface: str | None) -> dict[str, str]:
    """The variables horovodrun gives a gloo worker in ``slot``, whose rendezvous server is
    ``addr:port`` and whose network interface is ``iface`` (``None``: Horovod's default)."""
    environ = {
        "HOROVOD_HOSTNAME": slot.hostname,
        "HOROVOD_RANK": str(slot.rank),
        "HOROVOD_SIZE": str(slot.size),
        "HOROVOD_LOCAL_RANK": str(slot.local_rank),
        "HOROVOD_LOCAL_SIZE": str(slot.local_size),
        "HOROVOD_CROSS_RANK": str(slot.cross_rank),
        "HOROVOD_CROSS_SIZE": str(slot.cross_size),
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo",
        RENDEZVOUS_ADDR: addr,
        RENDEZVOUS_PORT: str(port),
    }
    if iface:
        environ["HOROVOD_GLOO_IFACE"] = iface
    return environ


def _encode(slot: Slot, port: int) -> str:
    return ",".join(map(str, (slot.hostname, slot.rank, slot.local_rank, slot.local_size,
                              slot.cross_rank, slot.cross_size, slot.size, port)))


def _decode(text: str) -> tuple[Slot, int]:
    host, *numbers = text.rsplit(",", 7)
    rank, local_rank, local_size, cross_rank, cross_size, size, port = map(int, numbers)
    return Slot(host, rank, local_rank, local_size, cross_rank, cross_size, size), port


def interface_towards(addr: str, environ: Mapping[str, str]) -> str | None:
    """The network interface gloo should use: ``HOROVOD_GLOO_IFACE``, else the first of torch's
    ``GLOO_SOCKET_IFNAME``, else the interface that routes to ``addr``
    (:func:`unirank.netroute.interface_towards`; ``None`` when it cannot be told: Horovod then
    uses the host name's address).

    Reads: HOROVOD_GLOO_IFACE, GLOO_SOCKET_IFNAME.
    """
    for name in ("HOROVOD_GLOO_IFACE", "GLOO_SOCKET_IFNAME"):
        value = environ.get(name, "").split(",")[0].strip()
        if value:
            return value
    return netroute.interface_towards(addr)


def _rendezvous(store: Any, rank: int, world_size: int) -> dict[str, str]:
    """Horovod's gloo variables for this rank, through unirank's store (see the module doc)."""
    global _server
    from unirank.runtime import state

    env = state.dist_env()
    addr, _ = env.require_master()
    store.set(f"{HOST_KEY}{rank}", state.hostname())
    if rank == 0:
        from horovod.runner.common.util.hosts import SlotInfo
        from horovod.runner.http.http_server import RendezvousServer

        keys = [f"{HOST_KEY}{r}" for r in range(world_size)]
        raw = store.multi_get(keys) if hasattr(store, "multi_get") else [store.get(k) for k in keys]
        plan = slot_plan([bytes(value).decode() for value in raw])
        _server = RendezvousServer()
        port = _server.start()
        _server.init([SlotInfo(s.hostname, s.rank, s.local_rank, s.cross_rank, s.size,
                               s.local_size, s.cross_size) for s in plan])
        for slot in plan:
            store.set(f"{SLOT_KEY}{slot.rank}", _encode(slot, port))
    slot, port = _decode(bytes(store.get(f"{SLOT_KEY}{rank}")).decode())
    return slot_environment(slot, addr, port, interface_towards(addr, os.environ))


def init(*, rank: int, world_size: int, store: Any, timeout: float | None, device: str) -> None:
    """Start Horovod for this rank (see the module docstring for the rendezvous).

    Reads and writes os.environ: the HOROVOD_* variables of :func:`slot_environment`, and
    HOROVOD_GLOO_TIMEOUT_SECONDS when it is unset and ``timeout`` is given.
    """
    try:
        import horovod.torch as hvd
    except ImportError as exc:
        raise ConfigError(
            f"the horovod backend cannot be imported ({exc})", variable="backend",
            value="horovod", hint=HINT,
        ) from None
    set_cuda_device(device)
    if store is not None and world_size > 1:
        os.environ.update(_rendezvous(store, rank, world_size))
    if timeout is not None:
        os.environ.setdefault("HOROVOD_GLOO_TIMEOUT_SECONDS", str(max(1, round(timeout))))
    hvd.init()
    if (hvd.rank(), hvd.size()) != (rank, world_size):
        raise ConfigError(
            f"Horovod started as rank {hvd.rank()} of {hvd.size()}, but the launcher says rank "
            f"{rank} of {world_size}", variable="HOROVOD_RANK",
            value=os.environ.get("HOROVOD_RANK"),
            hint="unset HOROVOD_* variables left over from another job",
        )


def finalize() -> None:
    """Shut Horovod down, and rank 0's rendezvous server with it."""
    global _server
    import horovod.torch as hvd

    try:
        hvd.shutdown()
    finally:
        server, _server = _server, None
        if server is not None:
            server.stop()


def problem(facts: CudaFacts) -> str | None:
    """Why Horovod cannot run here, or None (it is installed)."""
    if importlib.util.find_spec("horovod") is None:
        return "needs Horovod, which is not installed in this Python"
    return None


def uses_store(environ: Mapping[str, str]) -> bool:
    """unirank's store is needed unless horovodrun brought its rendezvous.

    Reads: HOROVOD_GLOO_RENDEZVOUS_ADDR.
    """
    return not environ.get(RENDEZVOUS_ADDR, "").strip()


def rank_and_size() -> tuple[int, int]:
    """Horovod's rank and size."""
    import horovod.torch as hvd

    return int(hvd.rank()), int(hvd.size())


def local_rank_and_size() -> tuple[int, int]:
    """Horovod's rank on this node and processes on this node."""
    import horovod.torch as hvd

    return int(hvd.local_rank()), int(hvd.local_size())


class HorovodCollectives:
    """unirank's collectives on Horovod (see :class:`~unirank.runtime.backends.Collectives`)."""

    def all_reduce(self, tensor: Any, op: str) -> Any:
        import horovod.torch as hvd

        ops = {"SUM": hvd.Sum, "MEAN": hvd.Average, "MIN": hvd.Min, "MAX": hvd.Max,
               "PRODUCT": hvd.Product}
        return hvd.allreduce_(tensor, op=ops[op])

    def all_gather(self, tensor: Any) -> Any:
        import horovod.torch as hvd

        return hvd.allgather(tensor)

    def all_gather_object(self, obj: Any) -> list[Any]:
        import horovod.torch as hvd

        # one name on every rank: Horovod's default is the object's type, so ranks passing
        # objects of different types (None on some) would wait for each other forever
        return list(hvd.allgather_object(obj, name="unirank.all_gather_object"))

    def broadcast(self, tensor: Any, src: int) -> Any:
        import horovod.torch as hvd

        return hvd.broadcast_(tensor, root_rank=src)

    def broadcast_object(self, obj: Any, src: int) -> Any:
        import horovod.torch as hvd

        # one name on every rank (see all_gather_object): the others may pass None
        return hvd.broadcast_object(obj, root_rank=src, name="unirank.broadcast_object")

    def barrier(self) -> None:
        import horovod.torch as hvd

        hvd.barrier()


def wrap_model(model: Any, *, sync_bn: bool, **kwargs: Any) -> Any:
    """Broadcast rank 0's parameters and buffers; no wrapper (Horovod averages in its optimizer).

    ``sync_bn=True`` is a ConfigError at a world larger than 1: unirank does not convert
    BatchNorm layers for Horovod (use ``horovod.torch.SyncBatchNorm`` in the model).
    """
    import horovod.torch as hvd

    if sync_bn and hvd.size() > 1:
        raise ConfigError(
            "is not supported with the horovod backend", variable="sync_bn", value="True",
            hint="use horovod.torch.SyncBatchNorm layers in the model, or sync_bn=False",
        )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    return model


def wrap_optimizer(optimizer: Any, **kwargs: Any) -> Any:
    """``hvd.DistributedOptimizer(optimizer, **kwargs)``; rank 0's state is broadcast first when
    the optimizer has state (a fresh one has none: Horovod's broadcast would then take a step
    with zero gradients to create it, which moves the weights when weight decay is on)."""
    import horovod.torch as hvd

    if optimizer.state_dict().get("state"):
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    return hvd.DistributedOptimizer(optimizer, **kwargs)


HINT = ("install Horovod with scripts/setup --horovod (Horovod 0.28.1, gloo controller), "
        "or choose backend 'gloo'")

BACKEND = Backend(
    name="horovod",
    init=init,
    finalize=finalize,
    problem=problem,
    problem_hint=HINT,
    wrap_model=wrap_model,
    wrap_optimizer=wrap_optimizer,
    collectives=HorovodCollectives(),
    rank_and_size=rank_and_size,
    local_rank_and_size=local_rank_and_size,
    launchers=("horovodrun",),
    uses_store=uses_store,
)
