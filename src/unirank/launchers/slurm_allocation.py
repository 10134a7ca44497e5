"""A Slurm allocation with no task launched: an ``sbatch`` batch shell or an ``salloc`` shell.

Such a shell has ``SLURM_JOB_ID``, ``SLURM_NTASKS`` and even ``SLURM_PROCID=0``, but no step. A
process that took ``SLURM_PROCID`` of ``SLURM_NTASKS`` here would wait forever for ranks that
nobody starts, so this is a state of its own: this process is alone (rank 0 of 1),
``launch_required`` says the tasks still have to be started with ``srun``, and ``planned_tasks``
and ``num_nodes``/``hosts`` say how many tasks on which nodes the allocation holds.
"""

from __future__ import annotations

from collections.abc import Mapping

from unirank.distenv import DistEnv
from unirank.envvars import first_set, read_int
from unirank.errors import ConfigError
from unirank.hostlist import expand
from unirank.launchers import slurm
from unirank.launchers._base import Context, resolve_master

NAME = "slurm-allocation"
KEYS = ("SLURM_JOB_ID",)


def detect(environ: Mapping[str, str], ctx: Context) -> DistEnv | None:
    """The allocation shell's description, or None outside an allocation or inside a step.

    Reads: SLURM_JOB_ID / SLURM_JOBID, SLURM_NTASKS, SLURM_JOB_NODELIST / SLURM_NODELIST,
    SLURMD_NODENAME, SLURM_STEP_ID, SLURM_PROCID, MASTER_ADDR, MASTER_PORT.
    """
    jid, jid_var = slurm.job_id(environ)
    if jid is None or slurm.in_step(environ):
        return None
    tasks_var = first_set(environ, "SLURM_NTASKS", "SLURM_NPROCS")
    planned = read_int(environ, tasks_var, minimum=1) if tasks_var else None
    hosts_var = first_set(environ, "SLURM_JOB_NODELIST", "SLURM_NODELIST") or ""
    hosts = tuple(expand(environ[hosts_var], variable=hosts_var)) if hosts_var else ()
    nodes_var = first_set(environ, "SLURM_JOB_NUM_NODES", "SLURM_NNODES")
    num_nodes = read_int(environ, nodes_var, minimum=1) if nodes_var else max(1, len(hosts))
    if hosts and len(hosts) != num_nodes:
        raise ConfigError(
            f"names {len(hosts)} node(s) but {nodes_var}={num_nodes}",
            variable=hosts_var, value=environ[hosts_var],
            hint="the allocation's variables disagree; were they copied from another job?",
        )
    node_name = environ.get("SLURMD_NODENAME") or (hosts[0] if hosts else ctx.hostname)
    master = resolve_master(environ, single_node=True, job_id=jid, job_source=jid_var)
    return DistEnv(
        launcher=NAME,
        master_addr=master.addr,
        master_port=master.port,
        job_id=jid,
        node_name=node_name,
        hosts=hosts,
        num_nodes=num_nodes,
        launch_required=True,
        planned_tasks=planned,
        sources={
            "rank": "alone: no srun step (SLURM_STEP_ID unset)",
            "world_size": "alone: no srun step (SLURM_STEP_ID unset)",
            "planned_tasks": tasks_var or "not set",
            "hosts": hosts_var or "not set",
            "num_nodes": nodes_var or f"derived: length of {hosts_var or 'no list'}",
            "job_id": jid_var,
            "master_addr": master.addr_source,
            "master_port": master.port_source,
        },
    )
