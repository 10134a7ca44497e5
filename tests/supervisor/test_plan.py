"""The one planner (pure), for ``unirank run`` and ``Parallel``: DistEnv objects and dicts in,
layouts and environments out. The rules of :mod:`unirank.supervisor.plan` are tested as tables."""

from __future__ import annotations

from typing import Any

import pytest

from unirank.contract import PRIVATE_VARIABLES, parse_seconds, resolve_init_timeout
from unirank.distenv import DistEnv
from unirank.errors import ConfigError
from unirank.launchers import detect
from unirank.rendezvous import derive_port
from unirank.supervisor.plan import (
    IN_PLACE,
    SPAWN,
    LaunchRequest,
    Plan,
    Worker,
    make_plan,
    node_index_of,
)
from unirank.supervisor.workerenv import WorkerWiring, worker_environ

LOCAL = DistEnv(launcher="local", node_name="box")


def local(environ: dict[str, str]) -> DistEnv:
    """No launcher, with ``environ``'s MASTER_ADDR/MASTER_PORT, as detection describes it."""
    return detect(environ, argv=[], hostname="box")


#: what unirank run asks for (spawn_default: auto's answer) and what Parallel asks for (none)
RUN = LaunchRequest()
PARALLEL = LaunchRequest(spawn_default=None)


def req(base: LaunchRequest = RUN, **changes: Any) -> LaunchRequest:
    from dataclasses import replace

    return replace(base, **changes)


def plan(request: LaunchRequest, outer: DistEnv = LOCAL, environ: dict[str, str] | None = None
         ) -> Plan:
    return make_plan(request, outer, environ or {}, run_id_fallback="rid")


def slurm_per_node(node_rank: int, nodes: int = 2, tasks_per_node: int = 1) -> DistEnv:
    hosts = tuple(f"n{i}" for i in range(nodes))
    return DistEnv(
        launcher="slurm", rank=node_rank, local_rank=0, world_size=nodes * tasks_per_node,
        local_world_size=tasks_per_node, node_rank=node_rank, num_nodes=nodes,
        master_addr="n0", master_port=derive_port("4242", "0"), job_id="4242", step_id="0",
        node_name=hosts[node_rank], hosts=hosts,
    )


# -- option values ------------------------------------------------------------------------------

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
    assert resolve_init_timeout(2.5, {}) == 2.5
    # one parser for unirank run, the bootstrap and unirank.init: a bad value is never ignored
    for bad in ("x", "0", "-3", "nan"):
        with pytest.raises(ConfigError, match=f"^UNIRANK_INIT_TIMEOUT='{bad}'"):
            resolve_init_timeout(None, {"UNIRANK_INIT_TIMEOUT": bad})
    with pytest.raises(ConfigError, match="^init_timeout='0'"):
        resolve_init_timeout(0, {}, option="init_timeout")


# -- layouts: one table for unirank run and Parallel -------------------------------------------

SRUN_2_PER_NODE = slurm_per_node(node_rank=0, tasks_per_node=2)
MPI_ONE_PER_NODE = DistEnv(launcher="openmpi", rank=1, world_size=2, local_world_size=1,
                           node_rank=1, num_nodes=2, master_addr=None, master_port=None,
                           node_name="m1")
TORCHRUN_ONE = DistEnv(launcher="torchrun", node_name="box", master_port=29400,
                       master_port_given=True)
#: an sbatch -n1 script / salloc -n1 shell: one task, none launched; it runs in place
ALLOC_ONE = DistEnv(launcher="slurm-allocation", node_name="node1", launch_required=True,
                    planned_tasks=1, master_port=derive_port("77"), job_id="77")

LAYOUTS = [
    # (request, outer, environ, mode, (world, local world, nnodes, node rank), ranks, master)
    (req(RUN, nproc_per_node=4), LOCAL, {}, SPAWN, (4, 4, 1, 0), [0, 1, 2, 3],
     ("127.0.0.1", 0)),
    (RUN, LOCAL, {}, SPAWN, (1, 1, 1, 0), [0], ("127.0.0.1", 0)),
    (PARALLEL, LOCAL, {}, IN_PLACE, (1, 1, 1, 0), [0], ("127.0.0.1", 29500)),
    (req(PARALLEL, nproc_per_node=2), local({"MASTER_PORT": "1234"}), {}, SPAWN, (2, 2, 1, 0),
     [0, 1], ("127.0.0.1", 1234)),
    # a single torchrun worker that spawns does not take its agent's port
    (req(PARALLEL, nproc_per_node=2), TORCHRUN_ONE,
     {"MASTER_PORT": "29400", "TORCHELASTIC_USE_AGENT_STORE": "True"}, SPAWN, (2, 2, 1, 0),
     [0, 1], ("127.0.0.1", 0)),
    (req(RUN, nproc_per_node=2, nnodes=2, node_rank=1, master_addr="head"), LOCAL, {}, SPAWN,
     (4, 2, 2, 1), [2, 3], ("head", 29500)),
    (req(PARALLEL, nproc_per_node=2, nnodes=2, node_rank=1), local({"MASTER_ADDR": "h"}), {},
     SPAWN, (4, 2, 2, 1), [2, 3], ("h", 29500)),
    # one node does not use an inherited MASTER_ADDR (as torchrun): a stale one cannot mislead
    (req(RUN, nproc_per_node=2), local({"MASTER_ADDR": "10.9.9.9"}), {}, SPAWN,
     (2, 2, 1, 0), [0, 1], ("127.0.0.1", 0)),
    (req(PARALLEL, nproc_per_node=2), local({"MASTER_ADDR": "10.9.9.9"}), {}, SPAWN,
     (2, 2, 1, 0), [0, 1], ("127.0.0.1", 0)),
    # a one-task allocation shell is a world of one process, for both
    (PARALLEL, ALLOC_ONE, {}, IN_PLACE, (1, 1, 1, 0), [0], ("127.0.0.1", derive_port("77"))),
    (req(PARALLEL, nproc_per_node=2), ALLOC_ONE, {}, SPAWN, (2, 2, 1, 0), [0, 1],
     ("127.0.0.1", 0)),
    (RUN, ALLOC_ONE, {}, SPAWN, (1, 1, 1, 0), [0], ("127.0.0.1", 0)),
    # one launched process per node: it is the node's launcher
    (req(RUN, nproc_per_node=4), slurm_per_node(node_rank=1, nodes=3), {}, SPAWN,
     (12, 4, 3, 1), [4, 5, 6, 7], ("n0", derive_port("4242", "0"))),
    (req(PARALLEL, nproc_per_node=4), slurm_per_node(node_rank=1, nodes=3), {}, SPAWN,
     (12, 4, 3, 1), [4, 5, 6, 7], ("n0", derive_port("4242", "0"))),
    (req(PARALLEL, nproc_per_node=2, master_addr="m0"), MPI_ONE_PER_NODE, {}, SPAWN,
     (4, 2, 2, 1), [2, 3], ("m0", 29500)),
    (PARALLEL, slurm_per_node(node_rank=1), {}, IN_PLACE, (2, 1, 2, 1), [1],
     ("n0", derive_port("4242", "0"))),
    # several launched processes per node: each is one rank, for both
    (RUN, SRUN_2_PER_NODE, {}, IN_PLACE, (4, 2, 2, 0), [0], ("n0", derive_port("4242", "0"))),
    (req(RUN, nproc_per_node=2), SRUN_2_PER_NODE, {}, IN_PLACE, (4, 2, 2, 0), [0],
     ("n0", derive_port("4242", "0"))),
    (PARALLEL, SRUN_2_PER_NODE, {}, IN_PLACE, (4, 2, 2, 0), [0],
     ("n0", derive_port("4242", "0"))),
    # standalone ignores the outer launcher and the environment
    (req(RUN, nproc_per_node=2, standalone=True), SRUN_2_PER_NODE,
     {"MASTER_PORT": "1234", "MASTER_ADDR": "far"}, SPAWN, (2, 2, 1, 0), [0, 1],
     ("127.0.0.1", 0)),
]


@pytest.mark.parametrize(
    ("request_", "outer", "environ", "mode", "shape", "ranks", "master"), LAYOUTS)
def test_layouts(request_: LaunchRequest, outer: DistEnv, environ: dict[str, str], mode: str,
                 shape: tuple[int, int, int, int], ranks: list[int],
                 master: tuple[str, int]) -> None:
    p = plan(request_, outer, environ)
    assert p.mode == mode
    assert (p.world_size, p.local_world_size, p.nnodes, p.node_rank) == shape
    assert [w.rank for w in p.workers] == ranks
    assert (p.master_addr, p.master_port) == master
    assert p.hosts_store == (0 in ranks)


REFUSALS = [
    # (request, outer, environ, variable, both numbers (or words) in the message)
    (req(RUN, nproc_per_node=4), SRUN_2_PER_NODE, {}, "nproc_per_node",
     ["'4'", "started 2 processes on this node", "--ntasks-per-node=1"]),
    (req(PARALLEL, nproc_per_node=3), SRUN_2_PER_NODE, {}, "nproc_per_node", ["'3'", "2"]),
    (req(RUN, nproc_per_node=2, nnodes=3), slurm_per_node(node_rank=1), {}, "nnodes",
     ["'3'", "a node count of 2"]),
    (req(PARALLEL, nproc_per_node=2, node_rank=0), slurm_per_node(node_rank=1), {},
     "node_rank", ["'0'", "this node the rank 1"]),
    (req(RUN, nproc_per_node=2, nnodes=2), local({"MASTER_ADDR": "h"}), {}, "node_rank",
     ["needed with 2 nodes", "static"]),
    (req(PARALLEL, nproc_per_node=2, nnodes=2), local({"MASTER_ADDR": "h"}), {}, "node_rank",
     ["needed with 2 nodes"]),
    (req(RUN, nproc_per_node=2, nnodes=2, node_rank=1), LOCAL, {}, "master_addr",
     ["needed with 2 nodes"]),
    (req(RUN, nnodes=2, node_rank=2, master_addr="h"), LOCAL, {}, "node_rank",
     ["'2'", "smaller than the number of nodes, 2"]),
    (req(RUN, nproc_per_node=2), MPI_ONE_PER_NODE, {}, "master_addr", ["openmpi"]),
    (req(RUN, standalone=True, nnodes=2), LOCAL, {}, "--nnodes", ["'2'", "--standalone"]),
    (req(PARALLEL, nnodes=2), LOCAL, {}, "nnodes", ["nproc_per_node"]),
    (req(PARALLEL, nproc_per_node=0), LOCAL, {}, "nproc_per_node", [">= 1"]),
    (req(PARALLEL, master_port=70000, nproc_per_node=1), LOCAL, {}, "master_port",
     ["1..65535"]),
    (RUN, DistEnv(launcher="slurm-allocation", num_nodes=2, launch_required=True,
                  planned_tasks=2), {}, "SLURM_STEP_ID", ["srun", "holding 2 tasks"]),
    (PARALLEL, DistEnv(launcher="slurm-allocation", num_nodes=2, launch_required=True),
     {}, "SLURM_STEP_ID", ["srun", "holding 2 nodes"]),
]


@pytest.mark.parametrize(("request_", "outer", "environ", "variable", "words"), REFUSALS)
def test_refusals_name_what_disagrees(request_: LaunchRequest, outer: DistEnv,
                                      environ: dict[str, str], variable: str,
                                      words: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        plan(request_, outer, environ)
    assert info.value.variable == variable
    message = str(info.value)
    assert "\n" not in message and "HINT:" in message
    for word in words:
        assert word in message


def test_a_stacked_node_is_master_localhost_whatever_master_addr_is_exported() -> None:
    """torchrun's one-node rendezvous at localhost:0 (``stacked``): its workers see localhost
    with or without an exported MASTER_ADDR; the static rendezvous keeps 127.0.0.1, and a
    given address wins over both."""
    for environ in ({}, {"MASTER_ADDR": "127.0.0.1"}, {"MASTER_ADDR": "elsewhere"}):
        outer = local(environ)
        assert plan(req(nproc_per_node=2, stacked=True), outer).master_addr == "localhost"
        assert plan(req(nproc_per_node=2), outer).master_addr == "127.0.0.1"
        assert plan(req(nproc_per_node=2, stacked=True, master_addr="h"), outer).master_addr \
            == "h"


def test_per_node_plan_names_nodes_and_run_id() -> None:
    p = plan(req(RUN, nproc_per_node=4), slurm_per_node(node_rank=1, nodes=3))
    assert p.hosts == ("n0", "n1", "n2") and p.node_name == "n1"
    assert p.run_id == "4242.0"
    assert p.ranks_per_node == (4, 4, 4)
    assert [node_index_of(rank, p.ranks_per_node) for rank in (0, 3, 4, 11, 12, -1)] == [
        0, 0, 1, 2, None, None]


def test_options_win_over_the_launcher_s_master_and_the_rdzv_id_is_the_run_id() -> None:
    p = plan(req(RUN, nproc_per_node=2, master_addr="x", master_port=5, node_rank=1,
                 nnodes=2, run_id="job7"), slurm_per_node(node_rank=1))
    assert (p.master_addr, p.master_port, p.node_rank, p.run_id) == ("x", 5, 1, "job7")


def test_in_place_keeps_the_launcher_s_own_ranks() -> None:
    """srun -m cyclic: ranks on a node need not be contiguous."""
    outer = DistEnv(launcher="slurm", rank=3, local_rank=1, world_size=4, local_world_size=2,
                    node_rank=1, num_nodes=2, master_addr="n0", master_port=2000,
                    node_name="n1", hosts=("n0", "n1"))
    p = plan(RUN, outer)
    assert p.workers == (Worker(3, 1),)
    env = worker_environ(p.with_port(2000), p.workers[0], {})
    assert (env["RANK"], env["LOCAL_RANK"], env["GROUP_RANK"], env["LOCAL_WORLD_SIZE"]) == (
        "3", "1", "1", "2")


# -- worker environments ------------------------------------------------------------------------

def test_worker_environ_is_torchrun_s_contract() -> None:
    p = plan(req(RUN, nproc_per_node=2, init_timeout=60, max_restarts=3, role="trainer"),
             slurm_per_node(node_rank=1))
    base = {"PATH": "/bin", "UNIRANK_STORE_FD": "9", "UNIRANK_NODE_NAMES": "stale"}
    env = worker_environ(p, p.workers[1], base,
                         WorkerWiring(supervisor_pid=77, restart_count=2))
    assert env["PATH"] == "/bin"
    expected = {
        "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2", "ROLE_RANK": "3", "ROLE_WORLD_SIZE": "4",
        "ROLE_NAME": "trainer", "MASTER_ADDR": "n0", "MASTER_PORT": str(derive_port("4242", "0")),
        "TORCHELASTIC_RUN_ID": "4242.0", "TORCHELASTIC_RESTART_COUNT": "2",
        "TORCHELASTIC_MAX_RESTARTS": "3", "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "OMP_NUM_THREADS": "1",
        "UNIRANK_INIT_TIMEOUT": "60", "UNIRANK_SUPERVISOR_PID": "77",
        "UNIRANK_NODE_NAME": "n1", "UNIRANK_NODE_NAMES": "n[0-1]",
    }
    assert {k: env.get(k) for k in expected} == expected
    assert "UNIRANK_STORE_FD" not in env  # only the supervisor sets it, for rank 0
    assert "PYTHONUNBUFFERED" not in env


def test_node_names_stay_small_at_any_node_count() -> None:
    """Every worker gets the node list for the watchdog's message: compressed, not O(nodes)."""
    hosts = tuple(f"nid{i:05d}" for i in range(12500))
    outer = DistEnv(launcher="slurm", rank=7, world_size=12500, node_rank=7, num_nodes=12500,
                    master_addr=hosts[0], master_port=2000, node_name=hosts[7], hosts=hosts)
    p = plan(req(RUN, nproc_per_node=8), outer)
    env = worker_environ(p, p.workers[0], {})
    assert env["UNIRANK_NODE_NAMES"] == "nid[00000-12499]"


def test_worker_environ_keeps_user_settings() -> None:
    p = plan(req(RUN, nproc_per_node=2)).with_port(4000)
    base = {"OMP_NUM_THREADS": "8", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}
    env = worker_environ(p, p.workers[0], base, WorkerWiring(unbuffered=True))
    assert env["OMP_NUM_THREADS"] == "8"
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "0"
    assert env["PYTHONUNBUFFERED"] == "1"
    assert env["MASTER_PORT"] == "4000"


@pytest.mark.parametrize(("request_", "omp"), [
    (req(RUN, nproc_per_node=1), None), (req(RUN, nproc_per_node=2), "1"),
    (req(PARALLEL, nproc_per_node=1), None), (req(PARALLEL, nproc_per_node=3), "1"),
])
def test_omp_num_threads_only_when_workers_share_the_node(request_: LaunchRequest,
                                                          omp: str | None) -> None:
    p = plan(request_).with_port(4000)
    assert worker_environ(p, p.workers[0], {}).get("OMP_NUM_THREADS") == omp


def test_virtual_local_rank_gives_each_worker_its_own_gpu() -> None:
    p = plan(req(RUN, nproc_per_node=2, virtual_local_rank=True)).with_port(4000)
    env = worker_environ(p, p.workers[1], {"CUDA_VISIBLE_DEVICES": "4,5"})
    assert (env["LOCAL_RANK"], env["CUDA_VISIBLE_DEVICES"], env["RANK"]) == ("0", "5", "1")


def test_worker_environ_needs_a_port() -> None:
    p = plan(RUN)
    with pytest.raises(ValueError, match="with_port"):
        worker_environ(p, p.workers[0], {})


def test_private_variables_are_the_bootstrap_s() -> None:
    assert set(PRIVATE_VARIABLES) == {"UNIRANK_SUPERVISOR_PID", "UNIRANK_STORE_FD",
                                      "UNIRANK_NODE_NAMES", "UNIRANK_RANKS_PER_NODE",
                                      "UNIRANK_EXIT_TIMEOUT", "UNIRANK_LINGER_FD",
                                      "UNIRANK_DONE_FD", "UNIRANK_TIMELINE",
                                      "UNIRANK_TIMELINE_FILE", "UNIRANK_FAULT_FILE",
                                      "UNIRANK_NUMA_BINDING", "UNIRANK_HANG_REPORT_AFTER",
                                      "UNIRANK_HANG_TIMEOUT", "UNIRANK_HANG_INTERVAL",
                                      "UNIRANK_HANG_NAMES", "UNIRANK_ON_SLOW"}


def test_the_run_id_has_one_home() -> None:
    """The request's, else the launcher's job and step, else the caller's fallback, else a
    fresh uuid4 (unirank run's one-node rendezvous and Parallel alike); and the backends a
    command offers are one tuple."""
    import uuid

    from unirank.bench.config import BACKENDS as BENCH
    from unirank.gpus import COMMAND_BACKENDS
    from unirank.sbatch.spec import BACKENDS as SBATCH

    fresh = make_plan(req(nproc_per_node=1), LOCAL, {}).run_id
    assert str(uuid.UUID(fresh)) == fresh
    assert make_plan(req(nproc_per_node=1), LOCAL, {}).run_id != fresh
    assert plan(req(nproc_per_node=1)).run_id == "rid"
    assert plan(req(nproc_per_node=1, run_id="mine")).run_id == "mine"
    assert plan(PARALLEL, slurm_per_node(0)).run_id == "4242.0"
    assert BENCH is COMMAND_BACKENDS and SBATCH is COMMAND_BACKENDS
