"""auto_dataloader: its rules in this process (a launcher's world seen as a DistEnv: samplers and
splits need no process group), and with 2 real gloo workers spawned by Parallel."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
    TensorDataset,
)

import unirank as ur
from _procs import run_job
from unirank.distenv import DistEnv
from unirank.runtime import data, state

SCRIPTS = Path(__file__).resolve().parent / "scripts"
DATASET = TensorDataset(torch.arange(32))


def as_rank(rank: int, world_size: int = 2, local_world_size: int | None = None) -> None:
    """This process seen as ``rank`` of ``world_size`` (all on one node unless told)."""
    local = world_size if local_world_size is None else local_world_size
    state.set_dist_env(DistEnv(launcher="torchrun", rank=rank, local_rank=rank % local,
                               world_size=world_size, local_world_size=local))


def one_pass(loader: Any) -> list[int]:
    """The dataset values (here: indices) one pass over ``loader`` gives, in order."""
    return [value for (batch,) in loader for value in batch.tolist()]


def test_world_of_one_is_a_plain_dataloader(use_env: None) -> None:
    as_rank(0, world_size=1)
    loader = ur.auto_dataloader(DATASET, batch_size=8, num_workers=0, shuffle=True)
    assert isinstance(loader, DataLoader)
    assert (loader.batch_size, loader.num_workers, loader.pin_memory) == (8, 0, False)
    assert isinstance(loader.sampler, RandomSampler)
    assert loader.dataset is DATASET
    assert len(loader) == 4
    plain = ur.auto_dataloader(DATASET)
    assert isinstance(plain.sampler, SequentialSampler)
    assert one_pass(plain) == list(range(32))


def test_total_batch_and_workers_are_split(use_env: None) -> None:
    as_rank(1)
    loader = ur.auto_dataloader(DATASET, batch_size=16, num_workers=4, shuffle=False)
    assert (loader.batch_size, loader.num_workers, len(loader)) == (8, 2, 2)
    sampler = loader.sampler
    assert isinstance(sampler, DistributedSampler)
    assert (sampler.num_replicas, sampler.rank, sampler.shuffle) == (2, 1, False)
    assert one_pass(loader) == list(range(1, 32, 2))
    assert ur.auto_dataloader(DATASET).sampler.shuffle  # type: ignore[attr-defined]
    workers = [ur.auto_dataloader(DATASET, num_workers=n).num_workers for n in (3, 1, 0)]
    assert workers == [2, 1, 0]
    assert ur.auto_dataloader(DATASET).batch_size == 1  # not given: DataLoader's default


def test_workers_are_split_over_the_processes_of_a_node_only(use_env: None) -> None:
    as_rank(1, world_size=4, local_world_size=1)  # four nodes, one process each
    assert ur.auto_dataloader(DATASET, batch_size=8, num_workers=2).num_workers == 2


def test_ranks_get_disjoint_shares_of_the_whole_dataset(use_env: None) -> None:
    shares = []
    for rank in range(2):
        as_rank(rank)
        shares.append(one_pass(ur.auto_dataloader(DATASET, batch_size=8, shuffle=True)))
    assert not set(shares[0]) & set(shares[1])
    assert sorted(shares[0] + shares[1]) == list(range(32))
    assert shares[0] != sorted(shares[0])  # shuffled


def test_batch_smaller_than_the_world_is_kept_as_ignite_keeps_it(use_env: None) -> None:
    as_rank(0, world_size=4)
    assert ur.auto_dataloader(DATASET, batch_size=3).batch_size == 3
    assert ur.auto_dataloader(DATASET, batch_size=1).batch_size == 1
    assert ur.auto_dataloader(DATASET, batch_size=4).batch_size == 1


def test_batch_that_does_not_divide_is_floored_without_a_warning(use_env: None) -> None:
    as_rank(0, world_size=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ur.auto_dataloader(DATASET, batch_size=10).batch_size == 2


def test_a_user_sampler_is_split_into_disjoint_shares(use_env: None) -> None:
    indices = list(range(0, 20, 2))
    shares = []
    for rank in range(2):
        as_rank(rank)
        loader = ur.auto_dataloader(DATASET, batch_size=2, sampler=indices)
        assert isinstance(loader.sampler, data.DistributedProxySampler)
        assert len(loader.sampler) == 5
        shares.append(one_pass(loader))
    assert shares == [indices[0::2], indices[1::2]]


def test_a_random_user_sampler_is_split_alike_on_every_rank_without_touching_torchs_rng(
    use_env: None,
) -> None:
    sampler = RandomSampler(range(10))
    shares: list[list[int]] = [[], []]
    torch.manual_seed(3)
    expected = torch.rand(2)
    torch.manual_seed(3)
    for epoch in range(2):
        for rank in range(2):
            proxy = data.DistributedProxySampler(sampler, num_replicas=2, rank=rank)
            proxy.set_epoch(epoch)
            shares[epoch].append(list(proxy))
        assert sorted(shares[epoch][0] + shares[epoch][1]) == list(range(10))
    assert shares[0] != shares[1]  # a new order each epoch
    assert torch.equal(torch.rand(2), expected)  # the caller's generator was left as it was


def test_a_short_user_sampler_is_padded_like_a_distributed_sampler(use_env: None) -> None:
    proxies = [data.DistributedProxySampler([7, 8, 9], num_replicas=2, rank=r) for r in range(2)]
    assert [list(p) for p in proxies] == [[7, 9], [8, 7]]
    as_rank(1)  # this process's place by default
    default = data.DistributedProxySampler([7, 8, 9])
    assert (default.num_replicas, default.rank, list(default)) == (2, 1, [8, 7])
    assert [len(p) for p in proxies] == [2, 2]


def test_user_samplers_that_cannot_be_split_are_refused(use_env: None) -> None:
    with pytest.raises(TypeError, match=r"\(generator\) has no len\(\)"):
        data.DistributedProxySampler((i for i in range(3)), num_replicas=2, rank=0)
    with pytest.raises(TypeError, match="must not be a distributed sampler already"):
        data.DistributedProxySampler(DistributedSampler(DATASET, 2, 0), num_replicas=2, rank=0)
    as_rank(0)
    with pytest.raises(ValueError, match="mutually exclusive"):  # as DataLoader at world 1
        ur.auto_dataloader(DATASET, sampler=range(4), shuffle=True)


def test_a_user_distributed_sampler_is_used_as_it_is(use_env: None) -> None:
    as_rank(1)
    own = DistributedSampler(DATASET, num_replicas=2, rank=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ur.auto_dataloader(DATASET, batch_size=4, sampler=own).sampler is own
    other = DistributedSampler(DATASET, num_replicas=4, rank=0)
    with pytest.warns(UserWarning) as caught:
        assert ur.auto_dataloader(DATASET, batch_size=4, sampler=other).sampler is other
    assert [str(w.message).split(":")[0] for w in caught] == [
        "Found distributed sampler with rank=0, but process rank is 1",
        "Found distributed sampler with num_replicas=4, but world size is 2",
    ]


def test_a_batch_sampler_is_left_alone_with_a_warning(use_env: None) -> None:
    as_rank(0)
    batches = BatchSampler(range(32), batch_size=4, drop_last=False)
    with pytest.warns(UserWarning) as caught:
        loader = ur.auto_dataloader(DATASET, batch_sampler=batches, num_workers=2)
    assert [str(w.message) for w in caught] == [
        "Found batch_sampler in provided kwargs: it is used as it is, not split over the 2 "
        "ranks; make it give each rank its own share"
    ]
    assert loader.batch_sampler is batches
    assert loader.num_workers == 1
    assert len(loader) == 8


class Stream(IterableDataset[int]):
    def __iter__(self) -> Iterator[int]:
        return iter(range(6))


def test_an_iterable_dataset_gets_no_sampler(use_env: None) -> None:
    as_rank(1)
    loader = ur.auto_dataloader(Stream(), batch_size=4)
    assert not isinstance(loader.sampler, DistributedSampler)
    assert [batch.tolist() for batch in loader] == [[0, 1], [2, 3], [4, 5]]


def test_pin_memory_defaults_to_true_on_cuda(
    use_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mocked, because it needs a GPU: this rank's device is cuda:0 (nothing is pinned here,
    the loaders are never iterated)."""
    as_rank(0, world_size=1)
    monkeypatch.setattr(state, "device", lambda: torch.device("cuda:0"))
    assert ur.auto_dataloader(DATASET).pin_memory is True
    assert ur.auto_dataloader(DATASET, pin_memory=False).pin_memory is False


def passes(loader: Any, explicit: list[int | None]) -> tuple[list[list[int]], list[int]]:
    """One pass per item of ``explicit`` (``set_epoch(e)`` first, unless None): the orders and
    the sampler's epoch during each pass."""
    orders, epochs = [], []
    for epoch in explicit:
        if epoch is not None:
            loader.sampler.set_epoch(epoch)
        orders.append(one_pass(loader))
        epochs.append(loader.sampler.epoch)
    return orders, epochs


def test_each_pass_moves_the_sampler_to_the_next_epoch(use_env: None) -> None:
    as_rank(0)
    loader = ur.auto_dataloader(DATASET, batch_size=8, shuffle=True)
    orders, epochs = passes(loader, [None, None, None])
    assert epochs == [0, 1, 2]
    assert len({tuple(order) for order in orders}) == 3
    assert loader.passes == 3


def test_an_explicit_set_epoch_wins_for_its_pass(use_env: None) -> None:
    as_rank(0)
    loader = ur.auto_dataloader(DATASET, batch_size=8, shuffle=True)
    # the same value again still counts as the user's: pass 2 repeats pass 1's order
    orders, epochs = passes(loader, [None, 0, None, 10, None])
    assert epochs == [0, 0, 1, 10, 11]
    assert orders[1] == orders[0]
    assert orders[2] != orders[0]
    # the usual loop that sets the epoch itself gets exactly its epochs
    loop = ur.auto_dataloader(DATASET, batch_size=8, shuffle=True)
    assert passes(loop, [0, 1, 2])[1] == [0, 1, 2]


def test_the_users_distributed_sampler_follows_the_rule_by_its_epoch_value(use_env: None) -> None:
    as_rank(0)
    own = DistributedSampler(DATASET, num_replicas=2, rank=0, shuffle=True)
    own.set_epoch(4)
    loader = ur.auto_dataloader(DATASET, batch_size=8, sampler=own)
    assert passes(loader, [None, None, 7, None])[1] == [4, 5, 7, 8]


def test_a_sampler_without_epochs_is_left_alone(use_env: None) -> None:
    as_rank(0, world_size=1)
    loader = ur.auto_dataloader(DATASET, batch_size=8, shuffle=True)
    orders = [one_pass(loader), one_pass(loader)]
    assert sorted(orders[0]) == sorted(orders[1]) == list(range(32))
    assert not hasattr(loader.sampler, "epoch")
    assert loader.passes == 2


@pytest.fixture(scope="module")
def two_ranks() -> list[dict[str, Any]]:
    """What each of 2 real gloo workers (spawned by Parallel) saw in scripts/data_job.py."""
    results = run_job(SCRIPTS / "data_job.py")
    assert [r["rank"] for r in results] == [0, 1]
    return results


@pytest.mark.integration
def test_real_ranks_split_batches_workers_and_data(two_ranks: list[dict[str, Any]]) -> None:
    for r in two_ranks:
        assert r["batch_size"] == 8
        assert r["sampler"] == ["AutoDistributedSampler", 2, r["rank"]]
        assert r["workers"] == [2, 2, 1, 0]
        assert [len(batch) for batch in r["batches"]] == [8, 8]
    loaded = [value for r in two_ranks for batch in r["batches"] for value in batch]
    assert sorted(loaded) == list(range(32))


@pytest.mark.integration
def test_real_ranks_share_a_user_sampler(two_ranks: list[dict[str, Any]]) -> None:
    first, second = two_ranks
    assert first["user_sampler"] == second["user_sampler"] == "DistributedProxySampler"
    for epoch in range(2):
        mine, theirs = first["user_passes"][epoch], second["user_passes"][epoch]
        assert len(mine) == len(theirs) == 5
        assert sorted(mine + theirs) == list(range(0, 20, 2))  # disjoint, covering


@pytest.mark.integration
def test_real_ranks_stream_an_iterable_dataset_without_a_sampler(
    two_ranks: list[dict[str, Any]],
) -> None:
    for r in two_ranks:
        start = 100 * r["rank"]
        assert r["stream"] == ["_InfiniteConstantSampler",
                               [[start, start + 1], [start + 2, start + 3]]]


@pytest.mark.integration
def test_real_ranks_report_bad_batches(two_ranks: list[dict[str, Any]]) -> None:
    for r in two_ranks:
        assert r["too_small"] == 1  # kept: smaller than the world
        assert r["uneven_warnings"] == []
        assert r["uneven_batch"] == 2
        assert len(r["batch_sampler_warnings"]) == 1
        assert r["batch_sampler_kept"]


@pytest.mark.integration
def test_real_ranks_reshuffle_every_epoch_unless_told(two_ranks: list[dict[str, Any]]) -> None:
    for r in two_ranks:
        orders = r["shuffled_passes"]
        assert r["shuffled_epochs"] == [0, 1, 0, 1]  # the third pass had set_epoch(0)
        assert orders[0] != orders[1]
        assert orders[2] == orders[0]
        assert orders[3] == orders[1]
    for epoch in range(4):
        both = two_ranks[0]["shuffled_passes"][epoch] + two_ranks[1]["shuffled_passes"][epoch]
        assert sorted(both) == list(range(32))
