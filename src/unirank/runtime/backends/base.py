"""What one backend entry is (:class:`Backend`), and the helpers torch.distributed entries share.

Nothing here imports torch at module import time: :func:`torch_init`, :func:`torch_finalize` and
:func:`set_cuda_device` import it when they run.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol

from unirank.runtime.backends.facts import CudaFacts, choose_device

__all__ = [
    "AUTO",
    "AutoRule",
    "Backend",
    "Collectives",
    "InitFn",
    "WrapLoader",
    "WrapModel",
    "WrapOptimizer",
    "always",
    "check_name",
    "gloo_banner_hidden",
    "no_problem",
    "normalize",
    "set_cuda_device",
    "torch_backend",
    "torch_finalize",
    "torch_init",
]

#: the name that asks :func:`~unirank.runtime.backends.choose_backend` to pick
AUTO = "auto"


class AutoRule(Protocol):
    """Whether ``auto`` may pick a backend, given the CUDA facts and the node's layout."""

    def __call__(self, facts: CudaFacts, *, local_world_size: int, per_task_gpus: bool) -> bool:
        """``local_world_size``: ranks on this node; ``per_task_gpus``: the launcher bound GPUs
        per task (see :func:`unirank.gpus.gpus_bound_per_task`)."""
        ...


class InitFn(Protocol):
    """Start the default process group of a backend on a rendezvous store."""

    def __call__(
        self, *, rank: int, world_size: int, store: Any, timeout: float | None, device: str
    ) -> None:
        """``store``: a torch ``Store`` every rank shares; ``timeout``: the group's collective
        timeout in seconds (``None``: the backend's default); ``device``: this rank's device,
        as the entry's :attr:`Backend.device` chose it."""
        ...


class WrapModel(Protocol):
    """A backend's ``auto_model`` step (see :attr:`Backend.wrap_model`)."""

    def __call__(self, model: Any, *, sync_bn: bool, **kwargs: Any) -> Any:
        """``model``: already on the rank's device; ``sync_bn`` and ``kwargs``: the user's
        ``auto_model`` arguments. Returns the model to train (wrapped or not)."""
        ...


class WrapOptimizer(Protocol):
    """A backend's ``auto_optim`` step (see :attr:`Backend.wrap_optimizer`)."""

    def __call__(self, optimizer: Any, **kwargs: Any) -> Any:
        """``kwargs``: the user's ``auto_optim`` keyword arguments. Returns the optimizer to use."""
        ...


class WrapLoader(Protocol):
    """A backend's last ``auto_dataloader`` step (see :attr:`Backend.wrap_loader`)."""

    def __call__(self, loader: Any) -> Any:
        """``loader``: the generic distributed DataLoader. Returns what the user iterates."""
        ...


class Collectives(Protocol):
    """A backend's own collectives, for a backend that is not a torch.distributed group
    (:attr:`Backend.collectives`). :mod:`unirank.runtime.collectives` checks the arguments and
    handles numbers, so these see tensors (or picklable objects for the ``_object`` ones) only.
    """

    def all_reduce(self, tensor: Any, op: str) -> Any:
        """Reduce ``tensor`` over every rank in place and return it; ``op`` is one of ``SUM``,
        ``MEAN``, ``MIN``, ``MAX``, ``PRODUCT``."""
        ...

    def all_gather(self, tensor: Any) -> Any:
        """Every rank's ``tensor`` (at least 1-d) concatenated along dim 0, in rank order."""
        ...

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order."""
        ...

    def broadcast(self, tensor: Any, src: int) -> Any:
        """Fill ``tensor`` in place with rank ``src``'s and return it."""
        ...

    def broadcast_object(self, obj: Any, src: int) -> Any:
        """Rank ``src``'s ``obj``."""
        ...

    def barrier(self) -> None:
        """Wait until every rank gets here."""
        ...


def always(facts: CudaFacts, *, local_world_size: int, per_task_gpus: bool) -> bool:
    """An :class:`AutoRule` that always applies (the fallback backend's)."""
    return True


def no_problem(facts: CudaFacts) -> str | None:
    """A ``problem`` rule for a backend that runs everywhere."""
    return None


def normalize(name: str) -> str:
    """A backend name as the registry compares it: stripped, lower case."""
    return name.strip().lower()


def check_name(name: str) -> None:
    """Raise ValueError unless ``name`` can be registered: lower case, no spaces, ``,`` or ``:``
    (those mark torch's per-device strings such as ``cpu:gloo,cuda:nccl``), not ``auto``."""
    if not name or name != normalize(name) or name == AUTO or any(c in name for c in " ,:"):
        raise ValueError(
            f"{name!r} is not a usable backend name (lower case, no spaces, commas or colons, "
            f"not {AUTO!r})"
        )


@dataclass(frozen=True)
class Backend:
    """One backend: how it is named, chosen, checked, placed, started and stopped.

    ``name``
        canonical name (lower case); what :func:`~unirank.runtime.backends.choose_backend`
        returns for it.
    ``init(*, rank, world_size, store, timeout, device)`` / ``finalize()``
        start / end the default process group (see :class:`InitFn`). They import their library
        (torch, ...) when called, never at module import.
    ``aliases``
        other names (lower case) that select this entry.
    ``auto_priority``
        ``None``: ``auto`` never picks it; otherwise ``auto`` tries the entries from the highest
        priority down and picks the first whose ``problem`` is ``None`` and whose
        ``auto_applies`` is true.
    ``auto_applies(facts, *, local_world_size, per_task_gpus)``
        see :class:`AutoRule`; default: always.
    ``problem(facts)``
        why the backend cannot run here (a phrase following "the <name> backend"), or ``None``.
        Asked for explicitly, a problem is a ConfigError naming ``backend`` with ``problem_hint``
        as its HINT.
    ``device(local_rank, facts)``
        the device a rank uses (``"cpu"``, ``"cuda:1"``...); default
        :func:`~unirank.runtime.backends.facts.choose_device`.
    ``current_device()``
        the device of a live group of this backend, when it is not simply ``device(...)``
        (nccl: the current CUDA device, which init or the user set); ``None``: ask ``device``.

    Training hooks (:mod:`unirank.runtime.training`, :mod:`unirank.runtime.data`), each ``None``
    for the generic torch.distributed behaviour; a backend such as Horovod or XLA sets the ones
    it needs:

    ``wrap_model(model, *, sync_bn, **kwargs)``
        replaces ``auto_model``'s step after the move to the device (generic: SyncBatchNorm and
        DistributedDataParallel when the world is larger than 1); called at every world size.
    ``wrap_optimizer(optimizer, **kwargs)``
        replaces ``auto_optim``'s step (generic: the optimizer unchanged).
    ``wrap_loader(loader)``
        applied to the DataLoader ``auto_dataloader`` built (generic: none), e.g. to return a
        device loader.

    Backends that are not a torch.distributed process group (Horovod, XLA) also set:

    ``collectives``
        their own collectives (:class:`Collectives`); while such an entry is live (its ``init``
        returned), :mod:`unirank.runtime.collectives` uses them and ``state.backend()`` is its
        name. ``None``: a torch.distributed backend (``init`` makes the default group).
    ``rank_and_size()``
        the live backend's own global rank and world size, which the getters then report.
    ``local_rank_and_size()``
        the live backend's own rank on its node and processes on the node (Horovod's
        ``local_rank``/``local_size``), which the getters then report.
    ``launchers``
        launcher names (:attr:`~unirank.distenv.DistEnv.launcher`) under which ``auto`` picks
        this entry before any other (``horovodrun``: horovod).
    ``uses_store(environ)``
        whether :func:`~unirank.runtime.lifecycle.init` must first connect unirank's rendezvous
        store (and run its join check) for this entry at a world larger than 1; default: yes.
        ``False`` gives ``init`` a ``store`` of ``None`` (the launcher brought its own
        rendezvous, as horovodrun does).
    ``spawn(nprocs, target)``
        the backend's own launcher, which :class:`~unirank.runtime.parallel.Parallel` uses
        instead of unirank's engine for ``nproc_per_node`` with no launcher around (XLA:
        ``xmp.spawn``); it runs ``target(local_rank)`` in each process. ``None``: unirank's.
    """

    name: str
    init: InitFn
    finalize: Callable[[], None]
    aliases: tuple[str, ...] = ()
    auto_priority: int | None = None
    auto_applies: AutoRule = always
    problem: Callable[[CudaFacts], str | None] = no_problem
    problem_hint: str | None = None
    device: Callable[[int, CudaFacts], str] = choose_device
    current_device: Callable[[], str] | None = None
    wrap_model: WrapModel | None = None
    wrap_optimizer: WrapOptimizer | None = None
    wrap_loader: WrapLoader | None = None
    collectives: Collectives | None = None
    rank_and_size: Callable[[], tuple[int, int]] | None = None
    local_rank_and_size: Callable[[], tuple[int, int]] | None = None
    launchers: tuple[str, ...] = ()
    uses_store: Callable[[Mapping[str, str]], bool] = lambda environ: True
    spawn: Callable[[int, Callable[[int], None]], None] | None = None


def set_cuda_device(device: str) -> None:
    """Make ``device`` the current CUDA device when it is a CUDA device (imports torch)."""
    if device.startswith("cuda"):
        import torch

        torch.cuda.set_device(torch.device(device))


def torch_init(name: str) -> InitFn:
    """The ``init`` of the torch.distributed backend ``name``.

    It makes the rank's device the current CUDA device when it is one (as unirank always did,
    whatever the backend), then calls ``torch.distributed.init_process_group(name, store=...)``.
    """

    def init(
        *, rank: int, world_size: int, store: Any, timeout: float | None, device: str
    ) -> None:
        import torch.distributed as dist

        set_cuda_device(device)
        with gloo_banner_hidden(name):
            dist.init_process_group(
                name,
                store=store,
                rank=rank,
                world_size=world_size,
                timeout=None if timeout is None else timedelta(seconds=timeout),
            )

    return init


#: torch releases whose gloo writes "[Gloo] Rank R is connected to N peer ranks..." to stdout
#: (file descriptor 1, from C++) whenever a group starts (seen with 2.9; 2.13 does not)
GLOO_BANNER_TORCH = ((2, 9),)


@contextlib.contextmanager
def gloo_banner_hidden(name: str) -> Iterator[None]:
    """Send file descriptor 1 to /dev/null while a gloo group starts on a torch release that
    prints a connection banner there (:data:`GLOO_BANNER_TORCH`): the banner would land between,
    or inside, the program's own lines (``unirank hello``'s, a script's data). Elsewhere, or for
    another backend, nothing changes."""
    import torch

    release = tuple(int(part) for part in torch.__version__.split(".")[:2] if part.isdigit())
    if "gloo" not in name or release not in GLOO_BANNER_TORCH:
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "wb") as sink:
            os.dup2(sink.fileno(), 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def torch_finalize() -> None:
    """The ``finalize`` of every torch.distributed backend: destroy the default group."""
    import torch.distributed as dist

    dist.destroy_process_group()


def torch_backend(name: str) -> Backend:
    """A plain entry for the torch.distributed backend ``name`` (``mpi``, ``ucc``,
    ``cpu:gloo,cuda:nccl``...): ``init_process_group(name)``, the common device rule, never
    picked by ``auto``."""
    return Backend(name=name, init=torch_init(name), finalize=torch_finalize)
