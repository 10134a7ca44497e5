"""Slurm step and allocation detection, from variable sets that srun/sbatch/salloc produce."""

from __future__ import annotations

import pytest

from unirank.errors import ConfigError
from unirank.launchers import detect
from unirank.rendezvous import derive_port

# What `srun -N2 --ntasks-per-node=2` gave task 3 on the testbed (see tests/fixtures/envs).
SRUN_N2_RANK3 = {
    "SLURM_JOB_ID": "37",
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "3",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURM_NTASKS": "4",
    "SLURM_NNODES": "2",
    "SLURM_JOB_NODELIST": "node[1-2]",
    "SLURM_STEP_NODELIST": "node[1-2]",
    "SLURM_STEP_NUM_TASKS": "4",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    "SLURM_TASKS_PER_NODE": "2(x2)",
    "SLURMD_NODENAME": "node2",
}


def step(**changes: str | None) -> dict[str, str]:
    env = dict(SRUN_N2_RANK3)
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        pytest.param(
            SRUN_N2_RANK3,
            dict(rank=3, local_rank=1, world_size=4, local_world_size=2, node_rank=1,
                 num_nodes=2, master_addr="node1", node_name="node2", tasks_per_node=(2, 2)),
            id="srun-N2-n4-rank3",
        ),
        pytest.param(
            # srun -N2 -n3: block distribution puts 2 tasks on node1, 1 on node2
            step(SLURM_PROCID="2", SLURM_LOCALID="0", SLURM_STEP_NUM_TASKS="3",
                 SLURM_NTASKS="3", SLURM_STEP_TASKS_PER_NODE="2,1", SLURM_TASKS_PER_NODE="2,1"),
            dict(rank=2, local_rank=0, world_size=3, local_world_size=1, node_rank=1,
                 num_nodes=2, tasks_per_node=(2, 1)),
            id="uneven-2,1-last-node",
        ),
        pytest.param(
            step(SLURM_PROCID="1", SLURM_LOCALID="1", SLURM_NODEID="0", SLURMD_NODENAME="node1",
                 SLURM_STEP_NUM_TASKS="3", SLURM_STEP_TASKS_PER_NODE="2,1"),
            dict(rank=1, local_rank=1, world_size=3, local_world_size=2, node_rank=0),
            id="uneven-2,1-first-node",
        ),
        pytest.param(
            # srun -N1 -n1 inside a two-node job: the step names one node, the job two
            step(SLURM_PROCID="0", SLURM_LOCALID="0", SLURM_NODEID="0", SLURMD_NODENAME="node1",
                 SLURM_STEP_NODELIST="node1", SLURM_STEP_NUM_TASKS="1", SLURM_NTASKS="1",
                 SLURM_STEP_NUM_NODES="1", SLURM_STEP_TASKS_PER_NODE="1"),
            dict(rank=0, world_size=1, num_nodes=1, hosts=("node1",), master_addr="node1"),
            id="one-task-step-in-two-node-job",
        ),
        pytest.param(
            # old Slurm without the SLURM_STEP_* layout variables: job-level fallbacks
            step(SLURM_STEP_NUM_TASKS=None, SLURM_STEP_NODELIST=None, SLURM_STEP_NUM_NODES=None,
                 SLURM_STEP_TASKS_PER_NODE=None, SLURM_TASKS_PER_NODE="2(x2)"),
            dict(rank=3, world_size=4, local_world_size=2, num_nodes=2, master_addr="node1"),
            id="job-level-fallback",
        ),
        pytest.param(
            step(SLURM_STEP_NODELIST="rack[1-2]-n[01-02]", SLURM_STEP_NUM_NODES="4",
                 SLURM_STEP_TASKS_PER_NODE="1(x4)", SLURMD_NODENAME="rack2-n02",
                 SLURM_LOCALID="0", SLURM_NODEID="3"),
            dict(node_rank=3, local_world_size=1, master_addr="rack1-n01",
                 hosts=("rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02")),
            id="multi-bracket-nodelist",
        ),
        pytest.param(
            step(MASTER_ADDR="10.0.0.5", MASTER_PORT="12345"),
            dict(master_addr="10.0.0.5", master_port=12345),
            id="explicit-master-wins",
        ),
        pytest.param(
            step(SLURMD_NODENAME=None),
            dict(node_rank=1, node_name="node2"),
            id="node-name-from-list-without-SLURMD_NODENAME",
        ),
    ],
)
def test_slurm_step(environ: dict[str, str], expected: dict[str, object]) -> None:
    env = detect(environ, argv=[], hostname="login1")
    assert env.launcher == "slurm"
    for field, value in expected.items():
        assert getattr(env, field) == value, field


def test_port_is_derived_from_job_and_step() -> None:
    env0 = detect(step(SLURM_STEP_ID="0"), argv=[])
    env1 = detect(step(SLURM_STEP_ID="1"), argv=[])
    other_job = detect(step(SLURM_JOB_ID="38"), argv=[])
    assert env0.master_port == derive_port("37", "0") == 20000 + 12 * 37
    assert len({env0.master_port, env1.master_port, other_job.master_port}) == 3
    assert env0.sources["master_port"] == "derived from SLURM_JOB_ID and SLURM_STEP_ID"


@pytest.mark.parametrize(
    ("changes", "variable"),
    [
        (dict(SLURM_PROCID="x"), "SLURM_PROCID"),
        (dict(SLURM_PROCID="4"), "SLURM_PROCID"),
        (dict(SLURM_PROCID="-1"), "SLURM_PROCID"),
        (dict(SLURM_STEP_NUM_TASKS="0"), "SLURM_STEP_NUM_TASKS"),
        (dict(SLURM_STEP_NODELIST=""), "SLURM_STEP_NODELIST"),
        (dict(SLURM_STEP_NODELIST="node[1-2"), "SLURM_STEP_NODELIST"),
        (dict(SLURM_STEP_NODELIST="node[1-3]"), "SLURM_STEP_NODELIST"),
        (dict(SLURM_STEP_TASKS_PER_NODE="3(x2)"), "SLURM_STEP_TASKS_PER_NODE"),
        (dict(SLURM_STEP_TASKS_PER_NODE="2(x"), "SLURM_STEP_TASKS_PER_NODE"),
        (dict(SLURM_LOCALID="2"), "SLURM_LOCALID"),
        (dict(SLURM_LOCALID=None), "SLURM_LOCALID"),
        (dict(SLURMD_NODENAME="elsewhere", SLURM_NODEID="2"), "SLURM_NODEID"),
        (dict(MASTER_PORT="-5"), "MASTER_PORT"),
        (dict(MASTER_PORT="70000"), "MASTER_PORT"),
        (dict(MASTER_ADDR=" "), "MASTER_ADDR"),
        (dict(SLURM_STEP_NUM_NODES="5", SLURM_STEP_NODELIST="n[1-5]",
              SLURM_STEP_TASKS_PER_NODE="1(x5)"), "SLURM_STEP_NUM_NODES"),
    ],
)
def test_slurm_step_errors_name_the_variable(changes: dict[str, str | None], variable: str) -> None:
    with pytest.raises(ConfigError) as info:
        detect(step(**changes), argv=[])
    message = str(info.value)
    assert message.startswith(variable), message
    assert "HINT:" in message
    assert "\n" not in message


BATCH_SHELL = {
    # what the batch shell of `sbatch -N2 --ntasks-per-node=2` has: no SLURM_STEP_ID
    "SLURM_JOB_ID": "41",
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "0",
    "SLURM_NTASKS": "4",
    "SLURM_NNODES": "2",
    "SLURM_TASKS_PER_NODE": "2(x2)",
    "SLURM_JOB_NODELIST": "node[1-2]",
    "SLURMD_NODENAME": "node1",
}


def test_batch_shell_is_an_allocation_not_rank_0_of_4() -> None:
    env = detect(BATCH_SHELL, argv=[])
    assert env.launcher == "slurm-allocation"
    assert env.launch_required is True
    assert (env.rank, env.world_size) == (0, 1)
    assert env.planned_tasks == 4
    assert env.hosts == ("node1", "node2")
    assert env.num_nodes == 2
    assert env.node_name == "node1"


def test_salloc_shell_on_login_node_is_an_allocation() -> None:
    env = detect({"SLURM_JOB_ID": "42", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "node1"},
                 argv=[], hostname="login")
    assert env.launcher == "slurm-allocation"
    assert env.planned_tasks == 2


def test_allocation_with_bad_ntasks_is_an_error() -> None:
    with pytest.raises(ConfigError, match="^SLURM_NTASKS='four'"):
        detect({**BATCH_SHELL, "SLURM_NTASKS": "four"}, argv=[])


def test_allocation_with_disagreeing_node_count_is_an_error() -> None:
    with pytest.raises(ConfigError, match="^SLURM_JOB_NODELIST='node\\[1-2\\]'"):
        detect({**BATCH_SHELL, "SLURM_NNODES": "3"}, argv=[])
