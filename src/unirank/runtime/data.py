"""``auto_dataloader``: one DataLoader call that splits the data over the ranks (ignite's meaning),
and a loader that moves its sampler to the next epoch by itself.

* :func:`auto_dataloader` builds an :class:`AutoDataLoader` (rules in its docstring);
* :class:`AutoDistributedSampler`: the ``DistributedSampler`` it makes, which counts explicit
  ``set_epoch`` calls (so the loader can tell the user's from its own);
* :class:`DistributedProxySampler`: a user's sampler, split so each rank gets its share;
* :class:`AutoDataLoader`: a DataLoader whose sampler's ``set_epoch`` is called on each pass.

Environment variables read: those the getters read without a process group (the launcher's,
through :func:`~unirank.runtime.state.dist_env`: rank, world size, local world size) and
CUDA_VISIBLE_DEVICES (through torch, for ``pin_memory``).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Iterator, Sized
from typing import Any, cast

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, IterableDataset
from torch.utils.data.dataloader import _BaseDataLoaderIter

from unirank.runtime import state

__all__ = [
    "AutoDataLoader",
    "AutoDistributedSampler",
    "DistributedProxySampler",
    "auto_dataloader",
    "per_process_workers",
    "per_rank_batch_size",
]


class AutoDistributedSampler(DistributedSampler[int]):
    """A ``DistributedSampler`` that counts the calls of :meth:`set_epoch`
    (``set_epoch_calls``), so that :class:`AutoDataLoader` knows whether the user set the epoch
    since its last pass, even to the value it already had."""

    def __init__(self, dataset: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(dataset, *args, **kwargs)
        self.set_epoch_calls = 0

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch`` for the next pass (it seeds the shuffle), and count the call."""
        super().set_epoch(epoch)
        self.set_epoch_calls += 1


class DistributedProxySampler(AutoDistributedSampler):
    """A user's sampler split over ``num_replicas`` ranks: this rank gets every
    ``num_replicas``-th index of the user's sampler's order, starting at ``rank``.

    Each pass lists the user's sampler once, with torch's global generator seeded by
    ``seed + epoch`` inside :func:`torch.random.fork_rng` (the caller's generator state is left
    as it was): a sampler that draws from torch's global generator (``RandomSampler``,
    ``WeightedRandomSampler``... without a ``generator``) gives the same order on every rank, a
    new one each epoch. A sampler with a generator of its own must be seeded alike on every rank.
    The order is padded by repeating its start so every rank gets ``ceil(len(sampler) /
    num_replicas)`` indices, as ``DistributedSampler`` does; the sampler must have ``len()``.
    ``num_replicas`` and ``rank`` default to this process's world size and global rank.

    Reads: the launcher's variables without a process group (when ``num_replicas`` or ``rank``
    is not given).
    """

    def __init__(
        self,
        sampler: Iterable[int],
        num_replicas: int | None = None,
        rank: int | None = None,
        seed: int = 0,
    ) -> None:
        if isinstance(sampler, DistributedSampler):
            raise TypeError("Argument sampler must not be a distributed sampler already")
        if not isinstance(sampler, Iterable):
            raise TypeError(f"Argument sampler should be instance of torch Sampler (or an "
                            f"iterable of indices), but given: {type(sampler)}")
        if not isinstance(sampler, Sized):
            raise TypeError(
                f"Argument sampler should have length: the sampler ({type(sampler).__name__}) "
                "has no len(), so it cannot be split over the ranks; give it __len__"
            )
        super().__init__(
            sampler,
            num_replicas=state.get_world_size() if num_replicas is None else num_replicas,
            rank=state.get_rank() if rank is None else rank,
            shuffle=False,
            seed=seed,
        )
        self.sampler = sampler

    def __iter__(self) -> Iterator[int]:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed + self.epoch)
            order = list(self.sampler)
        if len(order) < self.total_size:
            if not order:
                raise RuntimeError(
                    f"DistributedProxySampler: the sampler gave no index but has len() "
                    f"{len(cast(Sized, self.sampler))}"
                )
            order *= math.ceil(self.total_size / len(order))
        return iter(order[self.rank : self.total_size : self.num_replicas])


class AutoDataLoader(DataLoader[Any]):
    """A DataLoader (same arguments, ``len()``, ``dataset``, ``sampler``, ``batch_size``...)
    that calls its sampler's ``set_epoch`` by itself, so that no two epochs shuffle alike.

    Each pass (each ``iter(loader)``, as a ``for`` loop does) uses this epoch:

    * the first pass: the sampler's epoch as it is (0 for a new sampler);
    * a later pass: the epoch the user set with ``loader.sampler.set_epoch(e)`` since the
      previous pass began, if they did (an explicit call always wins for that pass); otherwise
      the previous pass's epoch + 1.

    So passes run epochs 0, 1, 2... by themselves; a script that calls ``set_epoch(epoch)``
    every epoch gets exactly its own epochs; one that resumes with a single
    ``set_epoch(10)`` continues 10, 11, 12... ``passes`` counts the passes started.

    Only a sampler with ``set_epoch`` and an integer ``epoch`` (a ``DistributedSampler``) is
    touched; a ``batch_sampler`` is not. For the samplers :func:`auto_dataloader` makes, any
    ``set_epoch`` call counts as the user's; for a ``DistributedSampler`` of the user's own, a
    call counts when it changed the epoch's value.
    """

    def __init__(self, dataset: Dataset[Any], **kwargs: Any) -> None:
        super().__init__(dataset, **kwargs)
        self.passes = 0
        self._pass_epoch = 0
        self._mark: tuple[str, int] | None = None

    def _epoch_mark(self) -> tuple[str, int] | None:
        """What changes when someone calls the sampler's ``set_epoch``; None: not epoch-aware."""
        sampler = self.sampler
        epoch = getattr(sampler, "epoch", None)
        if not callable(getattr(sampler, "set_epoch", None)) or not isinstance(epoch, int):
            return None
        if isinstance(sampler, AutoDistributedSampler):
            return ("calls", sampler.set_epoch_calls)
        return ("epoch", epoch)

    def _next_epoch(self) -> None:
        """Apply the epoch rule of the class docstring before a pass starts."""
        mark = self._epoch_mark()
        if mark is not None:
            if self.passes > 0 and mark == self._mark:
                self.sampler.set_epoch(self._pass_epoch + 1)  # type: ignore[attr-defined]
            self._pass_epoch = int(self.sampler.epoch)  # type: ignore[attr-defined]
            self._mark = self._epoch_mark()
        self.passes += 1

    def __iter__(self) -> _BaseDataLoaderIter:
        self._next_epoch()
        return super().__iter__()


def per_rank_batch_size(total: int, world_size: int) -> int:
    """The batch each of ``world_size`` ranks loads for a ``total`` batch (ignite's rule):
    ``total // world_size`` when ``total`` is at least the world size, else ``total`` as it is
    (a batch smaller than the world cannot be split)."""
    return total // world_size if total >= world_size else total


def per_process_workers(total: int, local_world_size: int) -> int:
    """The loader workers each of ``local_world_size`` processes of a node starts for ``total``
    (ignite's rule): ``ceil(total / local_world_size)`` when ``total`` is at least the number
    of processes, else ``total`` as it is."""
    return math.ceil(total / local_world_size) if total >= local_world_size else total


def _distributed_sampler(
    dataset: Dataset[Any], kwargs: dict[str, Any], world_size: int, rank: int
) -> DistributedSampler[Any]:
    """This rank's sampler at a world larger than 1; pops ``shuffle`` when it makes one."""
    sampler = kwargs.get("sampler")
    if sampler is None:
        shuffle = bool(kwargs.pop("shuffle", True))
        return AutoDistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=shuffle)
    if isinstance(sampler, DistributedSampler):
        if sampler.rank != rank:
            warnings.warn(f"Found distributed sampler with rank={sampler.rank}, but process rank "
                          f"is {rank}: it is used as it is", stacklevel=3)
        if sampler.num_replicas != world_size:
            warnings.warn(f"Found distributed sampler with num_replicas={sampler.num_replicas}, "
                          f"but world size is {world_size}: it is used as it is", stacklevel=3)
        return sampler
    # ``shuffle`` stays: DataLoader rejects it with a sampler, as it would at world size 1
    return DistributedProxySampler(sampler, num_replicas=world_size, rank=rank)


def auto_dataloader(dataset: Dataset[Any], **dataloader_kwargs: Any) -> DataLoader[Any]:
    """A DataLoader for this rank's share of ``dataset`` (:class:`AutoDataLoader`).

    At world size 1: ``DataLoader(dataset, **dataloader_kwargs)``, except for ``pin_memory``
    below. When the world is larger than 1 the arguments change so:

    * ``batch_size`` is the TOTAL over all ranks: each rank loads ``batch_size // world_size``
      when ``batch_size`` is at least the world size; a smaller one is kept as it is.
    * ``num_workers`` is divided over this node's processes: ``ceil(num_workers /
      local_world_size)`` each, when it is at least the number of processes.
    * no ``sampler``: a ``DistributedSampler(dataset, num_replicas=world_size, rank=rank,
      shuffle=shuffle)``, ``shuffle`` being the user's (default True, as in ignite) and not
      passed on to DataLoader;
    * a user's ``DistributedSampler``: used as it is (a warning if its rank or number of replicas
      differs from this process's);
    * another user's ``sampler``: wrapped in :class:`DistributedProxySampler` (each rank gets a
      disjoint share of its order);
    * a ``batch_sampler``: used as it is, with a one-line warning that it is not distributed;
    * an ``IterableDataset``: no sampler (the dataset must give each rank its own data).

    ``pin_memory`` defaults to True when this rank's device is CUDA (at every world size, as in
    ignite). The loader sets its sampler's epoch on every pass (rules: :class:`AutoDataLoader`).
    A backend entry's ``wrap_loader`` hook (XLA's device loader...) gets the loader last and
    returns what the caller iterates.

    Reads: the launcher's variables without a process group (rank, world size, local world
    size); CUDA_VISIBLE_DEVICES (through torch).
    """
    kwargs = dict(dataloader_kwargs)
    world_size = state.get_world_size()
    if world_size > 1:
        has_batch_sampler = kwargs.get("batch_sampler") is not None
        if isinstance(kwargs.get("batch_size"), int):
            kwargs["batch_size"] = per_rank_batch_size(kwargs["batch_size"], world_size)
        if isinstance(kwargs.get("num_workers"), int):
            kwargs["num_workers"] = per_process_workers(kwargs["num_workers"],
                                                        state.get_local_world_size())
        if has_batch_sampler:
            warnings.warn(
                f"Found batch_sampler in provided kwargs: it is used as it is, not split over the "
                f"{world_size} ranks; make it give each rank its own share",
                stacklevel=2,
            )
        elif not isinstance(dataset, IterableDataset):
            kwargs["sampler"] = _distributed_sampler(dataset, kwargs, world_size, state.get_rank())
    kwargs.setdefault("pin_memory", state.device().type == "cuda")
    loader = AutoDataLoader(dataset, **kwargs)
    entry = state.backend_entry()
    if entry is not None and entry.wrap_loader is not None:
        return cast(DataLoader[Any], entry.wrap_loader(loader))
    return loader
