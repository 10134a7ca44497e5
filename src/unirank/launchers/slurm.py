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
from unirank.launchers import slurm_vars as V
from unirank.launchers._base import Context, Launcher, Layout, MasterHint, finish
from unirank.words import counted

NAME = "slurm"


def in_step(environ: Mapping[str, str]) -> bool:
    """True inside a task that ``srun`` started.

    Reads: SLURM_STEP_ID (or the older SLURM_STEPID), SLURM_PROCID.
    """
    return first_set(environ, *V.STEP_ID) is not None and V.PROCID in environ


def hosts_of(environ: Mapping[str, str], names: tuple[str, ...]) -> tuple[tuple[str, ...], str]:
    """The nodes the first set of ``names`` lists, and that variable (``()``, ``""`` if none).

    Reads: ``names`` (a host list variable of :mod:`slurm_vars`).
    """
    var = first_set(environ, *names)
    return (tuple(expand(environ[var], variable=var)), var) if var else ((), "")


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
    world_var = first_set(environ, *V.STEP_NUM_TASKS) or V.STEP_NUM_TASKS[0]
    world = read_int(environ, world_var, minimum=1)
    hosts, hosts_var = hosts_of(environ, V.STEP_NODELIST)
    nodes_var = first_set(environ, *V.STEP_NUM_NODES) or ""
    if nodes_var:
        num_nodes = read_int(environ, nodes_var, minimum=1)
    else:
        num_nodes, nodes_var = (len(hosts) or 1), f"derived: length of {hosts_var or 'no list'}"
    if hosts and len(hosts) != num_nodes:
        raise ConfigError(
            f"names {counted(len(hosts), 'node')} but {nodes_var}={num_nodes}",
            variable=hosts_var, value=environ[hosts_var],
            hint="the step's variables disagree; were they copied from another job?",
        )
    if num_nodes > world:
        raise ConfigError(
            f"is more nodes than the {counted(world, 'task')} of {world_var}",
            variable=nodes_var, value=str(num_nodes),
            hint="every node of a step runs at least one task; check the srun options",
        )

    tpn_var = first_set(environ, *V.STEP_TASKS_PER_NODE) or ""
    if tpn_var:
        tpn = tuple(expand_tasks_per_node(environ[tpn_var], variable=tpn_var))
        if len(tpn) != num_nodes or sum(tpn) != world:
            raise ConfigError(
                f"gives {counted(sum(tpn), 'task')} on {counted(len(tpn), 'node')}, but the "
                "step has "
                f"{world_var}={world} on {counted(num_nodes, 'node')}",
                variable=tpn_var, value=environ[tpn_var],
                hint="the step's variables disagree; were they copied from another job?",
            )
    elif world % num_nodes == 0:
        tpn, tpn_var = (world // num_nodes,) * num_nodes, "derived: even split of tasks"
    else:
        raise ConfigError(
            f"is not set and {counted(world, 'task')} do not split evenly over "
            f"{counted(num_nodes, 'node')}",
            variable=V.STEP_TASKS_PER_NODE[0], value=None,
            hint=f"run under srun, which sets {V.STEP_TASKS_PER_NODE[0]}",
        )
    return StepLayout(world, world_var, hosts, hosts_var, num_nodes, nodes_var, tpn, tpn_var)


def _node_rank(environ: Mapping[str, str], layout: StepLayout) -> tuple[int, str]:
    """The node's index in the step: SLURMD_NODENAME's place in the step's own host list (which
    is step-relative by construction), else SLURM_NODEID. Reads: SLURMD_NODENAME, SLURM_NODEID.
    """
    name = environ.get(V.NODENAME, "").strip()
    if name and name in layout.hosts:
        node_rank, var = layout.hosts.index(name), f"{V.NODENAME} in {layout.hosts_var}"
    else:
        node_rank, var = read_int(environ, V.NODEID), V.NODEID
    check_rank(node_rank, layout.num_nodes, rank_var=V.NODEID, size_var=layout.num_nodes_var)
    return node_rank, var


def detect(environ: Mapping[str, str], ctx: Context) -> DistEnv | None:
    """A task of a Slurm step, or None outside one.

    Reads: SLURM_STEP_ID, SLURM_PROCID, SLURM_LOCALID, SLURM_NODEID, SLURMD_NODENAME,
    SLURM_JOB_ID, the step layout variables (:func:`read_step_layout`), MASTER_ADDR, MASTER_PORT,
    UNIRANK_NODE_NAME.
    """
    if not in_step(environ):
        return None
    layout = read_step_layout(environ)
    rank = read_int(environ, V.PROCID)
    check_rank(rank, layout.world_size, rank_var=V.PROCID, size_var=layout.world_var)
    node_rank, node_rank_var = _node_rank(environ, layout)
    local_rank = read_int(environ, V.LOCALID)
    local_world = layout.tasks_per_node[node_rank]
    if local_rank >= local_world:
        raise ConfigError(
            f"must be smaller than the {counted(local_world, 'task')} that "
            f"{layout.tasks_per_node_var} "
            f"gives node {node_rank}",
            variable=V.LOCALID, value=environ[V.LOCALID],
            hint="the step's variables disagree; were they copied from another job?",
        )
    jid, step = V.job_id(environ), V.step_id(environ)
    sources = {
        "rank": V.PROCID, "local_rank": V.LOCALID, "world_size": layout.world_var,
        "local_world_size": layout.tasks_per_node_var, "node_rank": node_rank_var,
        "num_nodes": layout.num_nodes_var, "hosts": layout.hosts_var,
    }
    return finish(
        NAME, environ, ctx,
        Layout(rank, local_rank, layout.world_size, local_world, node_rank, layout.num_nodes,
               sources),
        master=MasterHint(layout.hosts, layout.hosts_var, jid[0], step[0],
                          f"{jid[1]} and {step[1]}"),
        hosts=layout.hosts, tasks_per_node=layout.tasks_per_node, job_id=jid, step_id=step,
        own_node=(layout.hosts[node_rank], layout.hosts_var) if layout.hosts else None,
    )


LAUNCHER = Launcher(NAME, detect, keys=(V.STEP_ID[0], V.PROCID))
