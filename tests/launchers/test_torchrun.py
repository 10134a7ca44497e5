"""torchrun / torch.distributed.launch worker detection, alone and inside an srun step."""

from __future__ import annotations

import pytest

from unirank.errors import ConfigError
from unirank.launchers import detect

# What `torchrun --nnodes 2 --nproc_per_node 2 --node_rank 1 ...` gives its rank-3 worker.
TORCHRUN_RANK3 = {
    "RANK": "3",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "4",
    "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "1",
    "GROUP_WORLD_SIZE": "2",
    "ROLE_RANK": "3",
    "ROLE_WORLD_SIZE": "4",
    "ROLE_NAME": "default",
    "MASTER_ADDR": "node1",
    "MASTER_PORT": "29400",
    "TORCHELASTIC_RUN_ID": "none",
    "TORCHELASTIC_RESTART_COUNT": "0",
    "TORCHELASTIC_MAX_RESTARTS": "0",
    "TORCHELASTIC_USE_AGENT_STORE": "True",
}

# The srun task (one per node) that started that torchrun agent on node2.
SRUN_AGENT_NODE2 = {
    "SLURM_JOB_ID": "50",
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "1",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "1",
    "SLURM_STEP_NUM_TASKS": "2",
    "SLURM_NTASKS": "2",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_STEP_NODELIST": "node[1-2]",
    "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
    "SLURMD_NODENAME": "node2",
}


def test_torchrun_worker() -> None:
    env = detect(TORCHRUN_RANK3, argv=[], hostname="host-b")
    assert env.launcher == "torchrun"
    assert (env.rank, env.local_rank, env.world_size, env.local_world_size) == (3, 1, 4, 2)
    assert (env.node_rank, env.num_nodes) == (1, 2)
    assert (env.master_addr, env.master_port) == ("node1", 29400)
    assert env.node_name == "host-b"
    assert env.sources["node_rank"] == "GROUP_RANK"


def test_torchrun_inside_srun_wins_and_agrees() -> None:
    env = detect({**SRUN_AGENT_NODE2, **TORCHRUN_RANK3}, argv=[])
    assert env.launcher == "torchrun"
    assert env.rank == 3 and env.world_size == 4
    assert env.node_name == "node2"
    assert env.hosts == ("node1", "node2")


def test_torchrun_node_rank_disagreeing_with_slurm_is_named() -> None:
    environ = {**SRUN_AGENT_NODE2, **TORCHRUN_RANK3, "GROUP_RANK": "0", "RANK": "1"}
    with pytest.raises(ConfigError) as info:
        detect(environ, argv=[])
    message = str(info.value)
    assert message.startswith("GROUP_RANK='0'")
    assert "SLURM_PROCID=1" in message and "SLURM_NODEID=1" in message


def test_torchrun_nnodes_disagreeing_with_srun_tasks_is_named() -> None:
    # srun -N2 --ntasks-per-node=1 torchrun --nnodes 1 ...: two separate worlds that would hang
    environ = {**SRUN_AGENT_NODE2, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2",
               "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    with pytest.raises(ConfigError) as info:
        detect(environ, argv=[])
    assert str(info.value).startswith("SLURM_STEP_NUM_TASKS='2'")
    assert "torchrun runs 1 node (GROUP_WORLD_SIZE / --nnodes) but srun started 2 torchrun tasks" \
        in str(info.value)


def test_c10d_rendezvous_may_order_nodes_freely() -> None:
    """With a dynamic rendezvous (a real run id) torchrun picks group ranks itself."""
    environ = {**SRUN_AGENT_NODE2, **TORCHRUN_RANK3, "GROUP_RANK": "0", "RANK": "1",
               "TORCHELASTIC_RUN_ID": "job50"}
    env = detect(environ, argv=[])
    assert (env.launcher, env.rank, env.node_rank) == ("torchrun", 1, 0)
    assert env.job_id == "50"


def test_a_dynamic_world_may_count_other_nodes_than_the_srun_step() -> None:
    """An elastic job's node runs in a step of its own (``unirank sbatch --nnodes 1:2``), or
    its survivors go on in a step of more tasks after a node was lost: with a run id the
    world is the rendezvous's, whatever the step counts."""
    environ = {**SRUN_AGENT_NODE2, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2",
               "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
               "TORCHELASTIC_RUN_ID": "50"}
    env = detect(environ, argv=[])
    assert (env.launcher, env.world_size, env.num_nodes) == ("torchrun", 2, 1)


@pytest.mark.parametrize(
    "argv",
    [["--local-rank=1"], ["--local_rank=1"], ["--local_rank", "1"], ["x", "--local-rank", "1"]],
)
def test_legacy_launch_local_rank_argument(argv: list[str]) -> None:
    environ = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    env = detect(environ, argv=argv)
    assert env.launcher == "torchrun"
    assert env.local_rank == 1
    assert env.sources["local_rank"] == "--local-rank argument"
    assert env.local_world_size == 2  # one node assumed


def test_without_local_world_size_it_is_derived_from_groups() -> None:
    environ = {k: v for k, v in TORCHRUN_RANK3.items() if k != "LOCAL_WORLD_SIZE"}
    assert detect(environ, argv=[]).local_world_size == 2


@pytest.mark.parametrize(
    ("changes", "variable"),
    [
        ({"RANK": "four"}, "RANK"),
        ({"RANK": "4"}, "RANK"),
        ({"WORLD_SIZE": "0"}, "WORLD_SIZE"),
        ({"LOCAL_RANK": "2"}, "LOCAL_RANK"),
        ({"LOCAL_RANK": "-1"}, "LOCAL_RANK"),
        ({"GROUP_RANK": "2"}, "GROUP_RANK"),
        ({"MASTER_PORT": "0"}, "MASTER_PORT"),
        ({"MASTER_PORT": "http"}, "MASTER_PORT"),
    ],
)
def test_torchrun_errors_name_the_variable(changes: dict[str, str], variable: str) -> None:
    with pytest.raises(ConfigError) as info:
        detect({**TORCHRUN_RANK3, **changes}, argv=[])
    assert str(info.value).startswith(variable)


def test_elastic_run_id_without_rank_is_an_error() -> None:
    with pytest.raises(ConfigError, match="^RANK=<unset>"):
        detect({"TORCHELASTIC_RUN_ID": "abc", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, argv=[])


def test_local_rank_alone_is_not_torchrun() -> None:
    """Job scripts export LOCAL_RANK=$SLURM_LOCALID; that alone is no torchrun launch."""
    assert detect({"LOCAL_RANK": "0"}, argv=[]).launcher == "local"


RAY_WORKER = {"RANK": "3", "LOCAL_RANK": "0", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "1",
              "NODE_RANK": "1", "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "34469"}


def test_ray_train_worker_takes_its_node_rank_from_node_rank() -> None:
    """Ray Train put 3 workers on node 0 and 1 on node 1: rank 3 is alone on node 1 (by slot
    it would be node 3). Variables as Ray Train 2.60's TorchTrainer sets them."""
    env = detect(RAY_WORKER, argv=[])
    assert (env.launcher, env.rank, env.world_size, env.local_world_size) == ("torchrun", 3, 4, 1)
    assert (env.node_rank, env.sources["node_rank"]) == (1, "NODE_RANK")
    assert env.num_nodes == 4  # the slot rule's count; NODE_RANK fits in it
    uneven = detect({**RAY_WORKER, "RANK": "1", "LOCAL_WORLD_SIZE": "3", "LOCAL_RANK": "1",
                     "NODE_RANK": "0"}, argv=[])
    assert (uneven.node_rank, uneven.num_nodes) == (0, 2)
    torchrun = detect({**RAY_WORKER, "GROUP_RANK": "3", "GROUP_WORLD_SIZE": "4"}, argv=[])
    assert torchrun.node_rank == 3  # torchrun's own GROUP_RANK wins
