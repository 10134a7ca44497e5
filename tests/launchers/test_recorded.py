"""detect() on environments recorded from the real srun, sbatch, salloc, mpirun, torchrun and
horovodrun.

The files in tests/fixtures/envs were written by scripts/record-envs on the two-node testbed (the
horovodrun ones after scripts/setup --horovod); their README says which command produced each.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from unirank.launchers import detect

ENVS = Path(__file__).resolve().parents[1] / "fixtures" / "envs"

# file stem -> (launcher, rank, local_rank, world, local_world, node_rank, num_nodes,
#               master_addr, node_name)
EXPECTED: dict[str, tuple[str, int, int, int, int, int, int, str, str]] = {
    "srun_N1_n1_rank0": ("slurm", 0, 0, 1, 1, 0, 1, "node1", "node1"),
    "srun_N2_n4_rank0": ("slurm", 0, 0, 4, 2, 0, 2, "node1", "node1"),
    "srun_N2_n4_rank1": ("slurm", 1, 1, 4, 2, 0, 2, "node1", "node1"),
    "srun_N2_n4_rank2": ("slurm", 2, 0, 4, 2, 1, 2, "node1", "node2"),
    "srun_N2_n4_rank3": ("slurm", 3, 1, 4, 2, 1, 2, "node1", "node2"),
    "srun_N2_n3_rank0": ("slurm", 0, 0, 3, 2, 0, 2, "node1", "node1"),
    "srun_N2_n3_rank1": ("slurm", 1, 1, 3, 2, 0, 2, "node1", "node1"),
    "srun_N2_n3_rank2": ("slurm", 2, 0, 3, 1, 1, 2, "node1", "node2"),
    "srun_N2_npn1_rank0": ("slurm", 0, 0, 2, 1, 0, 2, "node1", "node1"),
    "srun_N2_npn1_rank1": ("slurm", 1, 0, 2, 1, 1, 2, "node1", "node2"),
    "srun_n2_gpus_per_task_rank0": ("slurm", 0, 0, 2, 2, 0, 1, "node1", "node1"),
    "srun_n2_gpus_per_task_rank1": ("slurm", 1, 1, 2, 2, 0, 1, "node1", "node1"),
    "sbatch_N2_n4_step_rank0": ("slurm", 0, 0, 4, 2, 0, 2, "node1", "node1"),
    "sbatch_N2_n4_step_rank3": ("slurm", 3, 1, 4, 2, 1, 2, "node1", "node2"),
    "salloc_N2_n4_step_rank0": ("slurm", 0, 0, 4, 3, 0, 2, "node1", "node1"),
    "salloc_N2_n4_step_rank3": ("slurm", 3, 0, 4, 1, 1, 2, "node1", "node2"),
    "srun_N2_torchrun_rank0": ("torchrun", 0, 0, 4, 2, 0, 2, "node1", "node1"),
    "srun_N2_torchrun_rank3": ("torchrun", 3, 1, 4, 2, 1, 2, "node1", "node2"),
    "torchrun_standalone_rank0": ("torchrun", 0, 0, 2, 2, 0, 1, "localhost", "vm"),
    "torchrun_standalone_rank1": ("torchrun", 1, 1, 2, 2, 0, 1, "localhost", "vm"),
    "torch_distributed_launch_use_env_rank0": ("torchrun", 0, 0, 2, 2, 0, 1, "localhost", "vm"),
    "torch_distributed_launch_use_env_rank1": ("torchrun", 1, 1, 2, 2, 0, 1, "localhost", "vm"),
    "mpirun_np2_rank0": ("openmpi", 0, 0, 2, 2, 0, 1, "127.0.0.1", "vm"),
    "mpirun_np2_rank1": ("openmpi", 1, 1, 2, 2, 0, 1, "127.0.0.1", "vm"),
    "salloc_N2_mpirun_np2_rank0": ("openmpi", 0, 0, 2, 1, 0, 2, "node1", "node1"),
    "salloc_N2_mpirun_np2_rank1": ("openmpi", 1, 0, 2, 1, 1, 2, "node1", "node2"),
    "sbatch_N2_n4_mpirun_np4_rank0": ("openmpi", 0, 0, 4, 2, 0, 2, "node1", "node1"),
    "sbatch_N2_n4_mpirun_np4_rank1": ("openmpi", 1, 1, 4, 2, 0, 2, "node1", "node1"),
    "sbatch_N2_n4_mpirun_np4_rank2": ("openmpi", 2, 0, 4, 2, 1, 2, "node1", "node2"),
    "sbatch_N2_n4_mpirun_np4_rank3": ("openmpi", 3, 1, 4, 2, 1, 2, "node1", "node2"),
    # horovodrun: the master is its rendezvous host; the node is HOROVOD_HOSTNAME (-H's name)
    "horovodrun_np2_rank0": ("horovodrun", 0, 0, 2, 2, 0, 1, "127.0.0.1", "localhost"),
    "horovodrun_np2_rank1": ("horovodrun", 1, 1, 2, 2, 0, 1, "127.0.0.1", "localhost"),
    # inside an allocation horovodrun's variables, not the allocation's, describe the worker
    "salloc_N2_horovodrun_np2_rank0": ("horovodrun", 0, 0, 2, 2, 0, 1, "127.0.0.1", "localhost"),
    "salloc_N2_horovodrun_np2_rank1": ("horovodrun", 1, 1, 2, 2, 0, 1, "127.0.0.1", "localhost"),
}

ALLOCATION_SHELLS = {"sbatch_batch_shell": 4, "salloc_N2_n4_shell": 4}
#: a batch script runs on the job's first node; an salloc shell where salloc was typed ("vm")
ALLOCATION_SHELL_NODES = {"sbatch_batch_shell": "node1", "salloc_N2_n4_shell": "vm"}


def load(stem: str) -> dict[str, str]:
    data: dict[str, str] = json.loads((ENVS / f"{stem}.json").read_text())
    return data


def test_every_recording_has_an_expectation() -> None:
    stems = {p.stem for p in ENVS.glob("*.json")}
    assert stems == set(EXPECTED) | set(ALLOCATION_SHELLS)


@pytest.mark.parametrize("stem", sorted(EXPECTED))
def test_recorded_launch(stem: str) -> None:
    env = detect(load(stem), argv=[], hostname="vm")
    got = (env.launcher, env.rank, env.local_rank, env.world_size, env.local_world_size,
           env.node_rank, env.num_nodes, env.master_addr, env.node_name)
    assert got == EXPECTED[stem]


@pytest.mark.parametrize("stem", sorted(ALLOCATION_SHELLS))
def test_recorded_allocation_shell_is_not_rank_0_of_n(stem: str) -> None:
    env = detect(load(stem), argv=[], hostname="vm")
    assert env.launcher == "slurm-allocation"
    assert (env.rank, env.world_size, env.launch_required) == (0, 1, True)
    assert env.planned_tasks == ALLOCATION_SHELLS[stem]
    assert env.must_launch
    assert env.node_name == ALLOCATION_SHELL_NODES[stem]


def test_steps_of_one_job_share_master_and_port() -> None:
    envs = [detect(load(f"srun_N2_n4_rank{r}"), argv=[]) for r in range(4)]
    assert len({(e.master_addr, e.master_port) for e in envs}) == 1
    assert sorted(e.rank for e in envs) == [0, 1, 2, 3]
