"""Values a library fixes when it is loaded (:mod:`unirank.supervisor.fork.importtime`): the
OpenBLAS thread count a worker's environment asks for, given to the OpenBLAS this process
loaded (numpy's), and random streams seeded again from the operating system. In this process:
no fork is needed to see a stream reseeded, and the OpenBLAS count is put back afterwards."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Iterator

import numpy
import pytest
import torch

from unirank.supervisor.fork.importtime import (
    SERVER_ONLY,
    apply_worker_values,
    blas_threads,
    openblas_thread_count,
    reseed_random_streams,
    set_openblas_threads,
)

CPUS = len(os.sched_getaffinity(0))


@pytest.mark.parametrize(("environ", "expected"), [
    ({}, CPUS),
    ({"OMP_NUM_THREADS": "1"}, 1),
    ({"GOTO_NUM_THREADS": "1", "OMP_NUM_THREADS": "9"}, 1),
    ({"OPENBLAS_NUM_THREADS": "1", "GOTO_NUM_THREADS": "9", "OMP_NUM_THREADS": "9"}, 1),
    ({"OMP_NUM_THREADS": "1,4"}, 1),  # a nested OpenMP list: its first level
    ({"OPENBLAS_NUM_THREADS": "0", "OMP_NUM_THREADS": "1"}, 1),  # 0 is no count
    ({"OPENBLAS_NUM_THREADS": "many", "OMP_NUM_THREADS": "1"}, 1),
    ({"OMP_NUM_THREADS": str(CPUS + 7)}, CPUS),  # never more than the CPUs
])
def test_the_count_openblas_takes_from_the_environment(environ: dict[str, str],
                                                      expected: int) -> None:
    assert openblas_thread_count(environ) == expected


def test_the_server_loads_openblas_with_one_thread() -> None:
    assert openblas_thread_count(SERVER_ONLY) == 1


@pytest.fixture
def loaded_blas() -> Iterator[list[int]]:
    """The counts of the OpenBLAS libraries loaded here (numpy's at least); put back after."""
    assert numpy.__version__
    before = blas_threads()
    assert before, "numpy loads OpenBLAS here"
    yield before
    set_openblas_threads({"OPENBLAS_NUM_THREADS": str(before[0])})


def test_each_loaded_openblas_gets_the_count_asked_for(loaded_blas: list[int]) -> None:
    set_openblas_threads({"OPENBLAS_NUM_THREADS": "1"})
    assert blas_threads() == [1] * len(loaded_blas)
    if CPUS > 1:
        set_openblas_threads({"OMP_NUM_THREADS": "2"})
        assert blas_threads() == [2] * len(loaded_blas)


def test_torch_numpy_and_the_authkey_are_drawn_again() -> None:
    torch.manual_seed(7)
    numpy.random.seed(7)
    key = multiprocessing.current_process().authkey
    reseed_random_streams()
    reseeded = (torch.rand(4).tolist(), numpy.random.rand(4).tolist())
    torch.manual_seed(7)
    numpy.random.seed(7)
    seeded = (torch.rand(4).tolist(), numpy.random.rand(4).tolist())
    assert reseeded[0] != seeded[0]
    assert reseeded[1] != seeded[1]
    assert multiprocessing.current_process().authkey != key


def test_apply_worker_values_reseeds_and_sets_the_count(loaded_blas: list[int]) -> None:
    torch.manual_seed(7)
    expected = torch.rand(4).tolist()
    torch.manual_seed(7)
    apply_worker_values({"OPENBLAS_NUM_THREADS": "1"})
    assert torch.rand(4).tolist() != expected
    assert blas_threads() == [1] * len(loaded_blas)
