"""How Parallel decides between serial, external and spawn, and what its workers get.

DistEnv values are built directly (as detection would give them); no process is started.
"""

from __future__ import annotations

from typing import Any

import pytest

from unirank.distenv import DistEnv
from unirank.errors import ConfigError
from unirank.runtime.parallel import EXTERNAL, SERIAL, SPAWN, Plan, make_plan, worker_envs
from unirank.runtime.spawn import worker_environ

LOCAL = DistEnv(launcher="local", node_name="box")
TORCHRUN_2 = DistEnv(
    launcher="torchrun", rank=1, local_rank=1, world_size=2, local_world_size=2,
    master_addr="localhost", master_port=40000,
)
# srun -N2 --ntasks-per-node=1: one task per node (seed 003), this is node2's task
SLURM_NODE2 = DistEnv(
    launcher="slurm", rank=1, local_rank=0, world_size=2, local_world_size=1, node_rank=1,
    num_nodes=2, master_addr="node1", master_port=20060, job_id="5", step_id="0",
    node_name="node2", hosts=("node1", "node2"),
)
# mpirun across two hosts without MASTER_ADDR: the master is unknown
MPI_NO_MASTER = DistEnv(
    launcher="openmpi", rank=0, world_size=2, local_world_size=1, num_nodes=2, master_addr=None,
)


def test_no_launcher_no_nproc_is_serial() -> None:
    assert make_plan(LOCAL, {}) == Plan(SERIAL)


def test_launched_world_is_external() -> None:
    assert make_plan(TORCHRUN_2, {}).mode == EXTERNAL


def test_nproc_matching_the_launchers_processes_per_node_runs_in_place() -> None:
    """The same script with nproc_per_node=2, started by torchrun --nproc_per_node 2."""
    assert make_plan(TORCHRUN_2, {}, nproc_per_node=2).mode == EXTERNAL


def test_nproc_disagreeing_with_the_launcher_is_an_error() -> None:
    with pytest.raises(ConfigError, match=r"nproc_per_node='4': disagrees with the launcher"):
        make_plan(TORCHRUN_2, {}, nproc_per_node=4)


def test_local_spawn_defaults() -> None:
    plan = make_plan(LOCAL, {}, nproc_per_node=3)
    assert plan == Plan(SPAWN, 3, 1, 0, "127.0.0.1", 29500, port_fixed=False)


def test_local_spawn_takes_master_port_from_the_environment_as_fixed() -> None:
    plan = make_plan(LOCAL, {"MASTER_PORT": "31234"}, nproc_per_node=2)
    assert (plan.master_port, plan.port_fixed) == (31234, True)


def test_single_torchrun_worker_does_not_reuse_its_agents_port() -> None:
    """torchrun --nproc_per_node 1 script.py where the script spawns: the agent owns the port."""
    env = DistEnv(launcher="torchrun", master_addr="localhost", master_port=41000)
    environ = {"MASTER_PORT": "41000", "TORCHELASTIC_USE_AGENT_STORE": "True"}
    plan = make_plan(env, environ, nproc_per_node=2)
    assert plan.port_fixed is False


def test_explicit_arguments_win_over_the_environment() -> None:
    environ = {"MASTER_ADDR": "envhost", "MASTER_PORT": "31234"}
    plan = make_plan(
        LOCAL, environ, nproc_per_node=2, nnodes=2, node_rank=1, master_addr="head",
        master_port=30001,
    )
    assert plan == Plan(SPAWN, 2, 2, 1, "head", 30001, port_fixed=True)


def test_multi_node_spawn_takes_master_addr_from_environment() -> None:
    plan = make_plan(LOCAL, {"MASTER_ADDR": "head"}, nproc_per_node=2, nnodes=2, node_rank=0)
    assert (plan.master_addr, plan.master_port, plan.port_fixed) == ("head", 29500, True)


def test_one_task_per_node_launcher_ranks_become_node_ranks() -> None:
    plan = make_plan(SLURM_NODE2, {}, nproc_per_node=2)
    assert plan == Plan(SPAWN, 2, 2, 1, "node1", 20060, port_fixed=True)


def test_one_task_per_node_disagreeing_nnodes_is_an_error() -> None:
    with pytest.raises(ConfigError, match=r"nnodes='3': disagrees with the launcher"):
        make_plan(SLURM_NODE2, {}, nproc_per_node=2, nnodes=3)


def test_one_task_per_node_without_master_names_master_addr() -> None:
    with pytest.raises(ConfigError, match=r"^MASTER_ADDR=<unset>"):
        make_plan(MPI_NO_MASTER, {}, nproc_per_node=2)


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"nproc_per_node": 0}, r"^nproc_per_node='0': must be an integer >= 1"),
        ({"nproc_per_node": True}, r"^nproc_per_node='True': must be an integer"),
        ({"nproc_per_node": 2, "nnodes": 0}, r"^nnodes='0'"),
        ({"nproc_per_node": 2, "node_rank": -1}, r"^node_rank='-1'"),
        ({"nproc_per_node": 2, "nnodes": 2}, r"^node_rank=<unset>: is needed when nnodes=2"),
        ({"nproc_per_node": 2, "nnodes": 2, "node_rank": 2}, r"^node_rank='2': must be smaller"),
        ({"nproc_per_node": 2, "nnodes": 2, "node_rank": 1}, r"^master_addr=<unset>: is needed"),
        ({"nproc_per_node": 2, "master_port": 70000}, r"^master_port='70000': is outside"),
        ({"nnodes": 2}, r"^nnodes='2': only apply when this process spawns workers"),
        ({"master_addr": "x"}, r"^master_addr='x': only apply"),
    ],
)
def test_bad_arguments_are_config_errors(kwargs: dict[str, Any], pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        make_plan(LOCAL, {}, **kwargs)


def test_worker_envs_number_the_ranks_node_major() -> None:
    plan = Plan(SPAWN, 2, 2, 1, "node1", 20060)
    workers = worker_envs(plan, SLURM_NODE2, "node2")
    assert [(w.rank, w.local_rank, w.node_rank) for w in workers] == [(2, 0, 1), (3, 1, 1)]
    for worker in workers:
        assert (worker.world_size, worker.local_world_size, worker.num_nodes) == (4, 2, 2)
        assert (worker.master_addr, worker.master_port) == ("node1", 20060)
        assert (worker.job_id, worker.node_name, worker.hosts) == ("5", "node2", ("node1", "node2"))


def test_worker_environ_is_torchruns_contract() -> None:
    worker = worker_envs(Plan(SPAWN, 2, 1, 0, "127.0.0.1", 31000), LOCAL, "box")[1]
    environ = worker_environ(worker, {})
    assert {k: environ[k] for k in (
        "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
        "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
        "TORCHELASTIC_USE_AGENT_STORE", "OMP_NUM_THREADS",
    )} == {
        "RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1", "ROLE_RANK": "1", "ROLE_WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "31000",
        "TORCHELASTIC_USE_AGENT_STORE": "True", "OMP_NUM_THREADS": "1",
    }


def test_worker_environ_keeps_users_omp_num_threads() -> None:
    worker = worker_envs(Plan(SPAWN, 1), LOCAL, "box")[0]
    assert "OMP_NUM_THREADS" not in worker_environ(worker, {"OMP_NUM_THREADS": "4"})
