"""Planning ``unirank run`` (pure): DistEnv objects and dicts in, layouts and environments out."""

from __future__ import annotations

import pytest

from unirank.distenv import DistEnv
from unirank.errors import ConfigError
from unirank.rendezvous import derive_port
from unirank.supervisor.plan import (
    PRIVATE_VARIABLES,
    Plan,
    RunRequest,
    make_plan,
    parse_nnodes,
    parse_nproc,
    parse_seconds,
    resolve_init_timeout,
)

LOCAL = DistEnv(launcher="local", node_name="box")


def plan(request: RunRequest, outer: DistEnv = LOCAL, environ: dict[str, str] | None = None
         ) -> Plan:
    return make_plan(request, outer, environ or {}, hostname="host", run_id_fallback="rid")


def slurm_per_node(node_rank: int, nodes: int = 2, tasks_per_node: int = 1) -> DistEnv:
    hosts = tuple(f"n{i}" for i in range(nodes))
    return DistEnv(
        launcher="slurm", rank=node_rank, local_rank=0, world_size=nodes * tasks_per_node,
        local_world_size=tasks_per_node, node_rank=node_rank, num_nodes=nodes,
        master_addr="n0", master_port=derive_port("4242", "0"), job_id="4242", step_id="0",
        node_name=hosts[node_rank], hosts=hosts,
    )


# -- option values ------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("value", "gpus", "cpus", "expected"),
    [("4", 0, 2, 4), ("auto", 0, 2, 1), ("auto", 8, 2, 8), ("gpu", 2, 64, 2), ("cpu", 4, 64, 64),
     (" AUTO ", 3, 1, 3), ("cpu", 0, None, 1)],
)
def test_parse_nproc(value: str, gpus: int, cpus: int | None, expected: int) -> None:
    assert parse_nproc(value, gpu_count=gpus, cpu_count=cpus) == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [("0", "must be at least 1"), ("-2", "must be at least 1"), ("two", "not a number"),
     ("gpu", "no GPU is visible")],
)
def test_parse_nproc_errors(value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        parse_nproc(value, gpu_count=0, cpu_count=8)
    assert info.value.variable == "--nproc-per-node"
    assert info.value.hint


def test_parse_nnodes() -> None:
    assert parse_nnodes("3") == 3
    assert parse_nnodes("2:2") == 2
    for bad, message in (("1:4", "elastic"), ("0", "at least 1"), ("x", "not a number")):
        with pytest.raises(ConfigError, match=message):
            parse_nnodes(bad)


def test_parse_seconds() -> None:
    assert parse_seconds("2.5", "--init-timeout") == 2.5
    assert parse_seconds("0", "--grace-period", allow_zero=True) == 0
    for bad in ("0", "-1", "nan", "inf", "soon"):
        with pytest.raises(ConfigError, match="--init-timeout"):
            parse_seconds(bad, "--init-timeout")


def test_init_timeout_precedence() -> None:
    assert resolve_init_timeout(None, {}) == 300
    assert resolve_init_timeout(None, {"UNIRANK_INIT_TIMEOUT": "12"}) == 12
    assert resolve_init_timeout("7", {"UNIRANK_INIT_TIMEOUT": "12"}) == 7
    with pytest.raises(ConfigError, match="UNIRANK_INIT_TIMEOUT='x'"):
        resolve_init_timeout(None, {"UNIRANK_INIT_TIMEOUT": "x"})


# -- layouts ------------------------------------------------------------------------------------

def test_local_single_node_picks_a_free_port() -> None:
    p = plan(RunRequest(nproc_per_node=4))
    assert (p.nnodes, p.node_rank, p.world_size) == (1, 0, 4)
    assert (p.master_addr, p.master_port) == ("127.0.0.1", 0)
    assert p.hosts_store and p.run_id == "rid" and p.node_name == "box"
    assert [p.global_rank(i) for i in range(4)] == [0, 1, 2, 3]


def test_local_master_from_environment_and_options() -> None:
    env = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "1234"}
    assert (plan(RunRequest(), environ=env).master_addr,
            plan(RunRequest(), environ=env).master_port) == ("10.0.0.1", 1234)
    p = plan(RunRequest(master_addr="a", master_port=99), environ=env)
    assert (p.master_addr, p.master_port) == ("a", 99)


def test_local_multi_node_needs_master_addr() -> None:
    with pytest.raises(ConfigError, match="--master-addr") as info:
        plan(RunRequest(nproc_per_node=2, nnodes=2, node_rank=1))
    assert "node 0" in str(info.value)
    p = plan(RunRequest(nproc_per_node=2, nnodes=2, node_rank=1, master_addr="head"))
    assert (p.master_addr, p.master_port, p.world_size) == ("head", 29500, 4)
    assert [p.global_rank(i) for i in range(2)] == [2, 3]
    assert not p.hosts_store


def test_node_rank_out_of_range() -> None:
    with pytest.raises(ConfigError, match="between 0 and 1"):
        plan(RunRequest(nnodes=2, node_rank=2, master_addr="h"))


def test_inside_srun_one_task_per_node_is_the_per_node_launcher() -> None:
    outer = slurm_per_node(node_rank=1, nodes=3)
    p = plan(RunRequest(nproc_per_node=4), outer)
    assert (p.nnodes, p.node_rank, p.world_size) == (3, 1, 12)
    assert (p.master_addr, p.master_port) == ("n0", derive_port("4242", "0"))
    assert p.hosts == ("n0", "n1", "n2") and p.node_name == "n1"
    assert p.run_id == "4242.0"
    assert p.node_of(0) == "n0" and p.node_of(11) == "n2" and p.node_of(5) == "n1"
    assert [p.global_rank(i) for i in range(4)] == [4, 5, 6, 7]


def test_options_override_the_outer_launcher() -> None:
    outer = slurm_per_node(node_rank=1)
    p = plan(RunRequest(nproc_per_node=2, master_addr="x", master_port=5, node_rank=0,
                        nnodes=2), outer)
    assert (p.master_addr, p.master_port, p.node_rank) == ("x", 5, 0)


def test_mpi_one_process_per_node_without_master_needs_an_address() -> None:
    outer = DistEnv(launcher="openmpi", rank=1, world_size=2, local_world_size=1, node_rank=1,
                    num_nodes=2, master_addr=None, master_port=None, node_name="m1")
    with pytest.raises(ConfigError, match="--master-addr") as info:
        plan(RunRequest(nproc_per_node=2), outer)
    assert "openmpi" in str(info.value)
    p = plan(RunRequest(nproc_per_node=2, master_addr="m0"), outer)
    assert (p.master_addr, p.master_port, p.node_rank, p.nnodes) == ("m0", 29500, 1, 2)


def test_several_tasks_per_node_is_refused_with_the_right_command() -> None:
    with pytest.raises(ConfigError, match="--ntasks-per-node=1"):
        plan(RunRequest(), slurm_per_node(node_rank=0, tasks_per_node=4))
    mpi = DistEnv(launcher="openmpi", world_size=4, local_world_size=2, num_nodes=2)
    with pytest.raises(ConfigError, match="ppr:1:node"):
        plan(RunRequest(), mpi)


def test_allocation_shell_is_not_planned() -> None:
    alloc = DistEnv(launcher="slurm-allocation", num_nodes=2, launch_required=True,
                    planned_tasks=2)
    with pytest.raises(ConfigError, match="srun"):
        plan(RunRequest(), alloc)


def test_standalone_ignores_everything_else() -> None:
    p = plan(RunRequest(nproc_per_node=2, standalone=True), DistEnv(launcher="local"),
             environ={"MASTER_PORT": "1234", "MASTER_ADDR": "far"})
    assert (p.nnodes, p.master_addr, p.master_port, p.run_id) == (1, "127.0.0.1", 0, "rid")
    with pytest.raises(ConfigError, match="--standalone runs on one node"):
        plan(RunRequest(standalone=True, nnodes=2))


# -- worker environments ------------------------------------------------------------------------

def test_worker_environ_is_torchrun_s_contract() -> None:
    p = plan(RunRequest(nproc_per_node=2, init_timeout=60), slurm_per_node(node_rank=1))
    base = {"PATH": "/bin", "UNIRANK_STORE_FD": "9", "UNIRANK_NODE_NAMES": "stale"}
    env = p.worker_environ(1, base, supervisor_pid=77)
    assert env["PATH"] == "/bin"
    expected = {
        "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2", "ROLE_RANK": "3", "ROLE_WORLD_SIZE": "4",
        "ROLE_NAME": "default", "MASTER_ADDR": "n0", "MASTER_PORT": str(derive_port("4242", "0")),
        "TORCHELASTIC_RUN_ID": "4242.0", "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "OMP_NUM_THREADS": "1",
        "UNIRANK_INIT_TIMEOUT": "60", "UNIRANK_SUPERVISOR_PID": "77",
        "UNIRANK_NODE_NAME": "n1", "UNIRANK_NODE_NAMES": "n0,n1",
    }
    assert {k: env.get(k) for k in expected} == expected
    assert "UNIRANK_STORE_FD" not in env  # only the supervisor sets it, for rank 0
    assert "PYTHONUNBUFFERED" not in env


def test_worker_environ_keeps_user_settings() -> None:
    p = plan(RunRequest(nproc_per_node=2)).with_port(4000)
    base = {"OMP_NUM_THREADS": "8", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}
    env = p.worker_environ(0, base, tag_output=True)
    assert env["OMP_NUM_THREADS"] == "8"
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "0"
    assert env["PYTHONUNBUFFERED"] == "1"
    assert env["MASTER_PORT"] == "4000"
    one = plan(RunRequest(nproc_per_node=1)).with_port(4000).worker_environ(0, {})
    assert "OMP_NUM_THREADS" not in one  # torchrun sets it only for several workers


def test_worker_environ_needs_a_port() -> None:
    with pytest.raises(ValueError, match="with_port"):
        plan(RunRequest()).worker_environ(0, {})


def test_private_variables_are_the_bootstrap_s() -> None:
    assert set(PRIVATE_VARIABLES) == {"UNIRANK_SUPERVISOR_PID", "UNIRANK_STORE_FD",
                                      "UNIRANK_NODE_NAMES", "UNIRANK_NODE_NAME"}
