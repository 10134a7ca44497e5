"""Backend and device choice.

There is no GPU on this machine: the CUDA facts (available, visible device count, NCCL) are
simulated by passing :class:`CudaFacts` values, which is exactly what the pure functions take.
"""

from __future__ import annotations

import pytest

from unirank.errors import ConfigError
from unirank.runtime.backend import (
    CudaFacts,
    choose_backend,
    choose_device,
    cuda_facts,
    gpus_bound_per_task,
    planned_device,
    visible_devices,
)

NO_CUDA = CudaFacts(available=False, device_count=0, nccl_available=False)
CPU_BUILD_NCCL = CudaFacts(available=False, device_count=0, nccl_available=True)
ONE_GPU = CudaFacts(available=True, device_count=1, nccl_available=True)
FOUR_GPUS = CudaFacts(available=True, device_count=4, nccl_available=True)
GPUS_NO_NCCL = CudaFacts(available=True, device_count=4, nccl_available=False)


@pytest.mark.parametrize(
    ("requested", "facts", "local_world_size", "per_task", "expected"),
    [
        (None, NO_CUDA, 1, False, "gloo"),
        ("auto", NO_CUDA, 4, False, "gloo"),
        ("AUTO", CPU_BUILD_NCCL, 1, False, "gloo"),
        (None, FOUR_GPUS, 4, False, "nccl"),
        (None, FOUR_GPUS, 2, False, "nccl"),
        ("auto", FOUR_GPUS, 8, False, "gloo"),  # more ranks than GPUs on the node
        (None, ONE_GPU, 2, False, "gloo"),  # two ranks would share one GPU
        (None, ONE_GPU, 2, True, "nccl"),  # srun --gpus-per-task=1: one GPU each
        (None, ONE_GPU, 1, False, "nccl"),
        (None, GPUS_NO_NCCL, 1, False, "gloo"),
        ("gloo", FOUR_GPUS, 4, False, "gloo"),
        ("nccl", FOUR_GPUS, 8, False, "nccl"),  # explicit wins
        (" Gloo ", NO_CUDA, 1, False, "gloo"),
        ("mpi", NO_CUDA, 1, False, "mpi"),
        ("cpu:gloo,cuda:nccl", NO_CUDA, 1, False, "cpu:gloo,cuda:nccl"),
    ],
)
def test_choose_backend(
    requested: str | None, facts: CudaFacts, local_world_size: int, per_task: bool, expected: str
) -> None:
    got = choose_backend(
        requested, facts, local_world_size=local_world_size, per_task_gpus=per_task
    )
    assert got == expected


@pytest.mark.parametrize("facts", [NO_CUDA, CPU_BUILD_NCCL, GPUS_NO_NCCL])
def test_explicit_nccl_without_cuda_is_a_config_error(facts: CudaFacts) -> None:
    with pytest.raises(ConfigError) as info:
        choose_backend("nccl", facts)
    message = str(info.value)
    assert message.startswith("backend='nccl': the nccl backend")
    assert "HINT: use backend 'gloo'" in message
    assert "\n" not in message


def test_unknown_backend_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"backend='nlcc': is not a torch.distributed backend"):
        choose_backend("nlcc", FOUR_GPUS)


@pytest.mark.parametrize(
    ("local_rank", "facts", "expected"),
    [
        (0, NO_CUDA, "cpu"),
        (3, NO_CUDA, "cpu"),
        (0, ONE_GPU, "cuda:0"),
        (1, ONE_GPU, "cuda:0"),  # ignite #3259: one visible GPU is cuda:0 whatever the rank
        (7, ONE_GPU, "cuda:0"),
        (0, FOUR_GPUS, "cuda:0"),
        (3, FOUR_GPUS, "cuda:3"),
        (5, FOUR_GPUS, "cuda:1"),  # more ranks than GPUs: round-robin
        (2, CudaFacts(available=True, device_count=0, nccl_available=True), "cpu"),
    ],
)
def test_choose_device(local_rank: int, facts: CudaFacts, expected: str) -> None:
    assert choose_device(local_rank, facts) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("", []),
        ("0", ["0"]),
        ("0,1", ["0", "1"]),
        ("2, 3", ["2", "3"]),
        ("GPU-8b1c,GPU-99aa", ["GPU-8b1c", "GPU-99aa"]),
        ("-1", []),
        ("NoDevFiles", []),
        ("0,-1,2", ["0"]),  # CUDA stops at the first invalid entry
    ],
)
def test_visible_devices(value: str | None, expected: list[str] | None) -> None:
    environ = {} if value is None else {"CUDA_VISIBLE_DEVICES": value}
    assert visible_devices(environ) == expected


@pytest.mark.parametrize(
    ("environ", "local_rank", "expected"),
    [
        # srun -n2 --gpus-per-task=1: one task sees GPU 0, the other GPU 1; each uses cuda:0
        ({"CUDA_VISIBLE_DEVICES": "0"}, 0, "cuda:0"),
        ({"CUDA_VISIBLE_DEVICES": "1"}, 1, "cuda:0"),
        # srun --ntasks-per-node=2 --gres=gpu:2: both see 0,1; local rank picks
        ({"CUDA_VISIBLE_DEVICES": "0,1"}, 0, "cuda:0"),
        ({"CUDA_VISIBLE_DEVICES": "0,1"}, 1, "cuda:1"),
        ({}, 1, "cpu"),
        ({"CUDA_VISIBLE_DEVICES": ""}, 0, "cpu"),
    ],
)
def test_planned_device_from_cuda_visible_devices(
    environ: dict[str, str], local_rank: int, expected: str
) -> None:
    assert planned_device(environ, local_rank) == expected


def test_planned_device_without_cuda_is_cpu() -> None:
    assert planned_device({"CUDA_VISIBLE_DEVICES": "0,1"}, 1, cuda_available=False) == "cpu"


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, False), ("", False), ("0", False), ("1", True), ("2", True), ("a100:1", True),
     ("x", False)],
)
def test_gpus_bound_per_task(value: str | None, expected: bool) -> None:
    environ = {} if value is None else {"SLURM_GPUS_PER_TASK": value}
    assert gpus_bound_per_task(environ) is expected


def test_cuda_facts_agree_with_torch() -> None:
    """The facts are read from real torch (on this CPU-only machine: no CUDA, gloo)."""
    import torch

    facts = cuda_facts()
    assert facts.available is torch.cuda.is_available()
    assert facts.device_count == (torch.cuda.device_count() if facts.available else 0)
    if not facts.available:
        assert choose_backend(None, facts) == "gloo"
        assert choose_device(0, facts) == "cpu"


@pytest.mark.parametrize(
    ("value", "expected"),
    [("gpu:per_task:1", True), ("gpu:per_task:2", True), ("gpu:single:1", False),
     ("cpu:per_task:1", False), ("", False), ("gpu:per_task:x", False)],
)
def test_gpus_bound_per_task_from_tres_bind(value: str, expected: bool) -> None:
    """srun --gpus-per-task=1 on Slurm 22.05 sets SLURMD_TRES_BIND, not SLURM_GPUS_PER_TASK."""
    assert gpus_bound_per_task({"SLURMD_TRES_BIND": value}) is expected
