"""A Slurm allocation with no task launched: an ``sbatch`` batch shell or an ``salloc`` shell.

Such a shell has ``SLURM_JOB_ID``, ``SLURM_NTASKS`` and even ``SLURM_PROCID=0``, but no step. A
process that took ``SLURM_PROCID`` of ``SLURM_NTASKS`` here would wait forever for ranks that
nobody starts, so this is a state of its own: this process is alone (rank 0 of 1),
``launch_required`` says so, and ``planned_tasks`` and ``num_nodes``/``hosts`` say how many tasks
on which nodes the allocation holds. ``DistEnv.must_launch`` decides what may run here: a shell
holding one task runs in place at world size 1; one holding more must start them through srun.
The node is named by the common rule: an ``salloc`` shell runs where ``salloc`` was typed, which
is not the allocation's first node.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence

from unirank.distenv import DistEnv
from unirank.envvars import first_set, read_int
from unirank.errors import ConfigError
from unirank.launchers import slurm
from unirank.launchers import slurm_vars as V
from unirank.launchers._base import Context, Launcher, Layout, MasterHint, finish
from unirank.words import counted

NAME = "slurm-allocation"
_ALONE = f"alone: no srun step ({V.STEP_ID[0]} unset)"


def detect(environ: Mapping[str, str], ctx: Context) -> DistEnv | None:
    """The allocation shell's description, or None outside an allocation or inside a step.

    Reads: SLURM_JOB_ID / SLURM_JOBID, SLURM_NTASKS, SLURM_JOB_NODELIST / SLURM_NODELIST,
    SLURM_JOB_NUM_NODES / SLURM_NNODES, SLURM_STEP_ID, SLURM_PROCID, SLURMD_NODENAME,
    UNIRANK_NODE_NAME, MASTER_ADDR, MASTER_PORT.
    """
    jid = V.job_id(environ)
    if jid[0] is None or slurm.in_step(environ):
        return None
    tasks_var = first_set(environ, *V.JOB_NUM_TASKS)
    planned = read_int(environ, tasks_var, minimum=1) if tasks_var else None
    hosts, hosts_var = slurm.hosts_of(environ, V.JOB_NODELIST)
    nodes_var = first_set(environ, *V.JOB_NUM_NODES)
    num_nodes = read_int(environ, nodes_var, minimum=1) if nodes_var else max(1, len(hosts))
    if hosts and len(hosts) != num_nodes:
        raise ConfigError(
            f"names {counted(len(hosts), 'node')} but {nodes_var}={num_nodes}",
            variable=hosts_var, value=environ[hosts_var],
            hint="the allocation's variables disagree; were they copied from another job?",
        )
    sources = {
        "rank": _ALONE, "world_size": _ALONE, "planned_tasks": tasks_var or "not set",
        "hosts": hosts_var or "not set",
        "num_nodes": nodes_var or f"derived: length of {hosts_var or 'no list'}",
    }
    return finish(
        NAME, environ, ctx, Layout(num_nodes=num_nodes, sources=sources),
        master=MasterHint(job_id=jid[0], job_source=jid[1]),
        hosts=hosts, job_id=jid, launch_required=True, planned_tasks=planned,
    )


def launch_command(argv: Sequence[str], executable: str) -> str:
    """The ``srun`` command line that would run this program (``argv``: ``sys.argv``) as the
    allocation's tasks."""
    args = list(argv)
    if not args or args[0] in ("-c", "-m", "") or args[0].endswith(".py"):
        args.insert(0, os.path.basename(executable) or "python3")
    return shlex.join(["srun", *args])


def _absent_reason(environ: Mapping[str, str]) -> str | None:
    return "inside an srun step" if slurm.in_step(environ) else None


LAUNCHER = Launcher(NAME, detect, keys=(V.JOB_ID[0],), absent_reason=_absent_reason)
