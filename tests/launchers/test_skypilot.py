"""SkyPilot: the four variables its ``run:`` command gets on every node (from SkyPilot's docs; no
SkyPilot cluster runs here), detection alone and the plan ``unirank run`` makes from it."""

from __future__ import annotations

import pytest

from unirank.errors import ConfigError
from unirank.launchers import detect, explain
from unirank.rendezvous import derive_port
from unirank.supervisor.plan import IN_PLACE, SPAWN, LaunchRequest, make_plan

SKY = {
    "SKYPILOT_NODE_RANK": "1",
    "SKYPILOT_NUM_NODES": "2",
    "SKYPILOT_NODE_IPS": "10.0.0.5\n10.0.0.6\n",
    "SKYPILOT_NUM_GPUS_PER_NODE": "4",
}


def test_one_process_per_node_is_its_node_rank() -> None:
    env = detect(SKY, argv=[], hostname="ip-10-0-0-6")
    assert env.launcher == "skypilot"
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size) == (1, 2, 0, 1)
    assert (env.node_rank, env.num_nodes) == (1, 2)
    assert env.hosts == ("10.0.0.5", "10.0.0.6")
    assert (env.master_addr, env.master_port) == ("10.0.0.5", 29500)
    assert env.node_name == "10.0.0.6"
    assert env.sources["master_addr"] == "first host of SKYPILOT_NODE_IPS"
    assert env.sources["rank"] == "SKYPILOT_NODE_RANK (one process per node)"


def test_task_id_gives_the_port_and_run_id_and_master_variables_win() -> None:
    task = "sky-2026-11-28-01-02-03-123456_mycluster_7"
    env = detect({**SKY, "SKYPILOT_TASK_ID": task}, argv=[])
    assert (env.job_id, env.master_port) == (task, derive_port(task))
    assert env.sources["master_port"] == "derived from SKYPILOT_TASK_ID"
    given = detect({**SKY, "MASTER_ADDR": "head", "MASTER_PORT": "1234"}, argv=[])
    assert (given.master_addr, given.master_port) == ("head", 1234)


def test_torchrun_or_mpirun_inside_the_run_command_wins() -> None:
    """The per-process launchers describe the process; SkyPilot's variables only its node."""
    worker = {**SKY, "RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4",
              "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "8008"}
    assert detect(worker, argv=[]).launcher == "torchrun"
    ranks = {**SKY, "OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4"}
    assert detect(ranks, argv=[]).launcher == "openmpi"
    by_name = {c.name: c for c in explain(worker, argv=[])}
    assert by_name["skypilot"].status == "outranked"


@pytest.mark.parametrize(("change", "match"), [
    ({"SKYPILOT_NODE_RANK": "2"}, r"^SKYPILOT_NODE_RANK='2': must be smaller than "
                                  r"SKYPILOT_NUM_NODES=2"),
    ({"SKYPILOT_NUM_NODES": "3"}, r"^SKYPILOT_NODE_IPS=.*lists 2 address\(es\) but "
                                  r"SKYPILOT_NUM_NODES=3"),
    ({"SKYPILOT_NUM_NODES": "0"}, r"^SKYPILOT_NUM_NODES='0'"),
    ({"SKYPILOT_NODE_RANK": "x"}, r"^SKYPILOT_NODE_RANK='x'"),
    ({"SKYPILOT_NUM_GPUS_PER_NODE": "four"}, r"^SKYPILOT_NUM_GPUS_PER_NODE='four'"),
])
def test_bad_values_are_one_config_error(change: dict[str, str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        detect({**SKY, **change}, argv=[])


def test_without_node_ips_several_nodes_need_master_addr() -> None:
    env = detect({"SKYPILOT_NODE_RANK": "0", "SKYPILOT_NUM_NODES": "2"}, argv=[])
    assert env.master_addr is None
    with pytest.raises(ConfigError, match="MASTER_ADDR"):
        env.require_master()
    single = detect({"SKYPILOT_NODE_RANK": "0", "SKYPILOT_NUM_NODES": "1"}, argv=[])
    assert (single.world_size, single.master_addr) == (1, "127.0.0.1")


def test_setup_phase_variables_alone_are_not_a_match() -> None:
    by_name = {c.name: c for c in explain({"SKYPILOT_NODE_IPS": "10.0.0.5"}, argv=[])}
    assert by_name["skypilot"].status == "absent"
    assert "SKYPILOT_NODE_IPS is set" in by_name["skypilot"].reason


def test_unirank_run_starts_the_nodes_workers_with_no_master_line() -> None:
    """Rule 4: one process per node, so ``unirank run -n 4`` makes a world of nodes x 4."""
    outer = detect(SKY, argv=[])
    plan = make_plan(LaunchRequest(spawn_default=4), outer, {}, run_id_fallback="rid")
    assert (plan.mode, plan.world_size, plan.nnodes, plan.node_rank) == (SPAWN, 8, 2, 1)
    assert [w.rank for w in plan.workers] == [4, 5, 6, 7]
    assert (plan.master_addr, plan.master_port) == ("10.0.0.5", 29500)
    assert plan.master_source == "first host of SKYPILOT_NODE_IPS"
    assert plan.hosts == ("10.0.0.5", "10.0.0.6")


def test_plain_python_is_one_rank_per_node() -> None:
    outer = detect(SKY, argv=[])
    plan = make_plan(LaunchRequest(spawn_default=None), outer, {}, run_id_fallback="rid")
    assert (plan.mode, plan.world_size, [w.rank for w in plan.workers]) == (IN_PLACE, 2, [1])
