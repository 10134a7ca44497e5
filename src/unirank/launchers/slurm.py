"""Slurm tasks started by ``srun`` (a job step is present).

Step-scoped variables are read first, because inside a step ``SLURM_JOB_NODELIST`` and
``SLURM_NNODES`` still describe the whole allocation: ``srun -N1 -n1`` in a two-node job has
``SLURM_STEP_NODELIST=node1`` but ``SLURM_JOB_NODELIST=node[1-2]``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from unirank.distenv import DistEnv
from unirank.envvars import check_rank, first_set, read_int
from unirank.errors import ConfigError
from unirank.hostlist import expand, expand_tasks_per_node
from unirank.launchers._base import Context, resolve_master

NAME = "slurm"
KEYS = ("SLURM_STEP_ID", "SLURM_PROCID")

NODELIST_VARS = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
NUM_TASKS_VARS = ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS")
NUM_NODES_VARS = ("SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES")
TASKS_PER_NODE_VARS = ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")


def in_step(environ: Mapping[str, str]) -> bool:
    """True inside a task that ``srun`` started.

    Reads: SLURM_STEP_ID (or the older SLURM_STEPID), SLURM_PROCID.
    """
    return first_set(environ, "SLURM_STEP_ID", "SLURM_STEPID") is not None and (
        "SLURM_PROCID" in environ
    )


def job_id(environ: Mapping[str, str]) -> tuple[str | None, str]:
    """The Slurm job id and the variable it came from. Reads: SLURM_JOB_ID, SLURM_JOBID."""
    name = first_set(environ, "SLURM_JOB_ID", "SLURM_JOBID")
    return (environ[name], name) if name else (None, "")


@dataclass(frozen=True)
class StepLayout:
    """How the tasks of one step are spread over its nodes."""

    world_size: int
    world_var: str
    hosts: tuple[str, ...]
    hosts_var: str
    num_nodes: int
    num_nodes_var: str
    tasks_per_node: tuple[int, ...]
    tasks_per_node_var: str


def read_step_layout(environ: Mapping[str, str]) -> StepLayout:
    """Tasks, nodes and tasks per node of the current step, checked against each other.

    Reads: SLURM_STEP_NUM_TASKS / SLURM_NTASKS / SLURM_NPROCS, SLURM_STEP_NODELIST /
    SLURM_JOB_NODELIST / SLURM_NODELIST, SLURM_STEP_NUM_NODES / SLURM_NNODES,
    SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE.
    """
    world_var = first_set(environ, *NUM_TASKS_VARS) or NUM_TASKS_VARS[0]
    world = read_int(environ, world_var, minimum=1)

    hosts_var = first_set(environ, *NODELIST_VARS) or ""
    hosts = tuple(expand(environ[hosts_var], variable=hosts_var)) if hosts_var else ()

    nodes_var = first_set(environ, *NUM_NODES_VARS) or ""
    if nodes_var:
        num_nodes = read_int(environ, nodes_var, minimum=1)
    else:
        num_nodes, nodes_var = (len(hosts) or 1), f"derived: length of {hosts_var or 'no list'}"
    if hosts and len(hosts) != num_nodes:
        raise ConfigError(
            f"names {len(hosts)} node(s) but {nodes_var}={num_nodes}",
            variable=hosts_var, value=environ[hosts_var],
            hint="the step's variables disagree; were they copied from another job?",
        )
    if num_nodes > world:
        raise ConfigError(
            f"is more nodes than the {world} task(s) of {world_var}",
            variable=nodes_var, value=str(num_nodes),
            hint="every node of a step runs at least one task; check the srun options",
        )

    tpn_var = first_set(environ, *TASKS_PER_NODE_VARS) or ""
    if tpn_var:
        tpn = tuple(expand_tasks_per_node(environ[tpn_var], variable=tpn_var))
        if len(tpn) != num_nodes or sum(tpn) != world:
            raise ConfigError(
                f"gives {sum(tpn)} task(s) on {len(tpn)} node(s), but the step has "
                f"{world_var}={world} on {num_nodes} node(s)",
                variable=tpn_var, value=environ[tpn_var],
                hint="the step's variables disagree; were they copied from another job?",
            )
    elif world % num_nodes == 0:
        tpn, tpn_var = (world // num_nodes,) * num_nodes, "derived: even split of tasks"
    else:
        raise ConfigError(
            f"is not set and {world} task(s) do not split evenly over {num_nodes} node(s)",
            variable=TASKS_PER_NODE_VARS[0], value=None,
            hint="run under srun, which sets SLURM_STEP_TASKS_PER_NODE",
        )
    return StepLayout(world, world_var, hosts, hosts_var, num_nodes, nodes_var, tpn, tpn_var)


def detect(environ: Mapping[str, str], ctx: Context) -> DistEnv | None:
    """A task of a Slurm step, or None outside one.

    Reads: SLURM_STEP_ID, SLURM_PROCID, SLURM_LOCALID, SLURM_NODEID, SLURMD_NODENAME,
    SLURM_JOB_ID, the step layout variables (:func:`read_step_layout`), MASTER_ADDR, MASTER_PORT.
    """
    if not in_step(environ):
        return None
    layout = read_step_layout(environ)
    rank = read_int(environ, "SLURM_PROCID")
    check_rank(rank, layout.world_size, rank_var="SLURM_PROCID", size_var=layout.world_var)

    node_name_var = first_set(environ, "SLURMD_NODENAME")
    node_name = environ.get("SLURMD_NODENAME", "").strip()
    if node_name and node_name in layout.hosts:
        # The node's index in the step's own list is step-relative by construction.
        node_rank = layout.hosts.index(node_name)
        node_rank_var = f"SLURMD_NODENAME in {layout.hosts_var}"
    else:
        node_rank, node_rank_var = read_int(environ, "SLURM_NODEID"), "SLURM_NODEID"
    check_rank(node_rank, layout.num_nodes, rank_var="SLURM_NODEID", size_var=layout.num_nodes_var)

    local_rank = read_int(environ, "SLURM_LOCALID")
    local_world = layout.tasks_per_node[node_rank]
    if local_rank >= local_world:
        raise ConfigError(
            f"must be smaller than the {local_world} task(s) that {layout.tasks_per_node_var} "
            f"gives node {node_rank}",
            variable="SLURM_LOCALID", value=environ["SLURM_LOCALID"],
            hint="the step's variables disagree; were they copied from another job?",
        )
    if not node_name:
        if layout.hosts:
            node_name, node_name_var = layout.hosts[node_rank], layout.hosts_var
        else:
            node_name, node_name_var = ctx.hostname, "socket.gethostname()"

    jid, jid_var = job_id(environ)
    step_var = first_set(environ, "SLURM_STEP_ID", "SLURM_STEPID") or "SLURM_STEP_ID"
    step = environ[step_var]
    master = resolve_master(
        environ,
        hosts=layout.hosts,
        hosts_source=layout.hosts_var,
        single_node=layout.num_nodes == 1,
        job_id=jid,
        step_id=step,
        job_source=f"{jid_var} and {step_var}",
    )
    return DistEnv(
        launcher=NAME,
        rank=rank,
        local_rank=local_rank,
        world_size=layout.world_size,
        local_world_size=local_world,
        node_rank=node_rank,
        num_nodes=layout.num_nodes,
        master_addr=master.addr,
        master_port=master.port,
        job_id=jid,
        step_id=step,
        node_name=node_name,
        hosts=layout.hosts,
        sources={
            "rank": "SLURM_PROCID",
            "local_rank": "SLURM_LOCALID",
            "world_size": layout.world_var,
            "local_world_size": layout.tasks_per_node_var,
            "node_rank": node_rank_var,
            "num_nodes": layout.num_nodes_var,
            "master_addr": master.addr_source,
            "master_port": master.port_source,
            "job_id": jid_var,
            "step_id": step_var,
            "node_name": node_name_var or "SLURMD_NODENAME",
            "hosts": layout.hosts_var,
        },
    )
