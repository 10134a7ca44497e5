"""DistEnv (pure): its derived answers, the master it requires and the allocation-shell rule."""

from __future__ import annotations

import json

import pytest

from unirank.distenv import DistEnv
from unirank.errors import ConfigError

FOUR = DistEnv(launcher="slurm", rank=3, local_rank=1, world_size=4, local_world_size=2,
               node_rank=1, num_nodes=2, master_addr="node1", master_port=20036, job_id="3",
               step_id="0", node_name="node2", hosts=("node1", "node2"),
               sources={"rank": "SLURM_PROCID"})


def test_torchrun_environ_is_torchrun_s_worker_contract() -> None:
    assert FOUR.torchrun_environ() == {
        "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2", "ROLE_RANK": "3", "ROLE_WORLD_SIZE": "4",
        "ROLE_NAME": "default", "MASTER_ADDR": "node1", "MASTER_PORT": "20036",
    }


def test_to_dict_is_json_ready_and_complete() -> None:
    data = FOUR.to_dict()
    assert json.loads(json.dumps(data)) == data
    assert data["hosts"] == ["node1", "node2"] and data["sources"] == {"rank": "SLURM_PROCID"}
    assert data["launch_required"] is False and data["planned_tasks"] is None
    assert {"rank", "world_size", "node_name", "master_addr", "master_port"} <= set(data)


def test_is_distributed() -> None:
    assert FOUR.is_distributed
    assert not DistEnv(launcher="local").is_distributed


def test_sources_do_not_take_part_in_equality() -> None:
    assert DistEnv(launcher="local", sources={"rank": "a"}) == DistEnv(launcher="local")


def test_require_master_names_the_variable_to_set() -> None:
    assert FOUR.require_master() == ("node1", 20036)
    no_addr = DistEnv(launcher="openmpi", world_size=4, num_nodes=2, master_addr=None)
    with pytest.raises(ConfigError) as info:
        no_addr.require_master()
    assert info.value.variable == "MASTER_ADDR"
    assert "openmpi launcher does not name the master host of this 2-node world" in str(
        info.value)
    assert "mpirun -x MASTER_ADDR" in str(info.value)
    with pytest.raises(ConfigError) as info:
        no_addr.require_master(option="master_addr")
    assert info.value.variable == "master_addr"
    assert "--master-addr" in str(info.value)
    with pytest.raises(ConfigError) as info:
        DistEnv(launcher="x", master_port=None).require_master()
    assert info.value.variable == "MASTER_PORT"


def test_torchrun_environ_needs_the_master() -> None:
    with pytest.raises(ConfigError, match="MASTER_ADDR"):
        DistEnv(launcher="openmpi", master_addr=None).torchrun_environ()


def test_master_given_flags_default_to_not_given() -> None:
    env = DistEnv(launcher="local")
    assert (env.master_addr, env.master_port) == ("127.0.0.1", 29500)
    assert not env.master_addr_given and not env.master_port_given


@pytest.mark.parametrize(("planned", "nodes", "must"), [
    (None, 1, False), (1, 1, False), (2, 1, True), (4, 2, True), (None, 2, True),
])
def test_an_allocation_shell_must_launch_only_beyond_one_task(planned: int | None, nodes: int,
                                                              must: bool) -> None:
    env = DistEnv(launcher="slurm-allocation", launch_required=True, planned_tasks=planned,
                  num_nodes=nodes)
    assert env.must_launch is must
    if must:
        with pytest.raises(ConfigError) as info:
            env.require_launched("srun python3 job.py")
        text = str(info.value)
        assert info.value.variable == "SLURM_STEP_ID"
        assert "no task was launched" in text and "\n" not in text
        assert text.endswith("HINT: start the tasks with: srun python3 job.py")
    else:
        env.require_launched("srun python3 job.py")  # runs in place, at world size 1


def test_outside_an_allocation_shell_nothing_must_launch() -> None:
    assert not FOUR.must_launch
    FOUR.require_launched("srun x")
    assert not DistEnv(launcher="local", planned_tasks=8).must_launch
