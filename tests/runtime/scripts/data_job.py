"""Spawns 2 gloo workers with Parallel; each checks auto_dataloader and prints one
``RESULT {json}`` line of what it saw.

Usage: python data_job.py
"""

from __future__ import annotations

import json
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import BatchSampler, IterableDataset, SubsetRandomSampler, TensorDataset

import unirank as ur

DATASET = TensorDataset(torch.arange(32))


class Stream(IterableDataset[int]):
    """Each rank streams its own numbers (100 * rank ...)."""

    def __iter__(self) -> Iterator[int]:
        start = 100 * ur.get_rank()
        return iter(range(start, start + 4))


def values(loader: Any) -> list[int]:
    """One pass: the dataset values (here: the indices) in the order this rank loads them."""
    return [value for (batch,) in loader for value in batch.tolist()]


def warned(**kwargs: Any) -> tuple[list[str], Any]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = ur.auto_dataloader(DATASET, **kwargs)
    return [str(w.message) for w in caught], loader


def body(local_rank: int) -> None:
    rank = ur.get_rank()
    loader = ur.auto_dataloader(DATASET, batch_size=16)
    sampler = loader.sampler
    result: dict[str, Any] = {
        "rank": rank,
        "batch_size": loader.batch_size,
        "batches": [batch.tolist() for (batch,) in loader],
        "sampler": [type(sampler).__name__, sampler.num_replicas, sampler.rank],  # type: ignore[attr-defined]
        "workers": [ur.auto_dataloader(DATASET, batch_size=2, num_workers=n).num_workers
                    for n in (4, 3, 1, 0)],
    }
    user = ur.auto_dataloader(DATASET, batch_size=2, sampler=SubsetRandomSampler(range(0, 20, 2)))
    result["user_sampler"] = type(user.sampler).__name__
    result["user_passes"] = [values(user), values(user)]
    stream = ur.auto_dataloader(Stream(), batch_size=4)
    result["stream"] = [type(stream.sampler).__name__, [b.tolist() for b in stream]]
    result["too_small"] = ur.auto_dataloader(DATASET, batch_size=1).batch_size
    result["uneven_warnings"], uneven = warned(batch_size=5)
    result["uneven_batch"] = uneven.batch_size
    batch_sampler = BatchSampler(range(32), batch_size=4, drop_last=False)
    result["batch_sampler_warnings"], given = warned(batch_sampler=batch_sampler)
    result["batch_sampler_kept"] = given.batch_sampler is batch_sampler
    shuffled = ur.auto_dataloader(DATASET, batch_size=8, shuffle=True)
    passes, epochs = [], []
    for explicit in (None, None, 0, None):
        if explicit is not None:
            shuffled.sampler.set_epoch(explicit)  # type: ignore[attr-defined]
        passes.append(values(shuffled))
        epochs.append(shuffled.sampler.epoch)  # type: ignore[attr-defined]
    result["shuffled_passes"], result["shuffled_epochs"] = passes, epochs
    ur.barrier()
    sys.stdout.write("RESULT " + json.dumps(result) + "\n")  # one write: lines stay whole
    sys.stdout.flush()


if __name__ == "__main__":
    with ur.Parallel(backend="gloo", nproc_per_node=2) as parallel:
        parallel.run(body)
