"""Slurm's variable names, in one place: which variables give which fact (first present wins).

Inside a step (a task ``srun`` started) the step-scoped names come first, because the job-scoped
ones (``SLURM_JOB_NODELIST``, ``SLURM_NNODES``) still describe the whole allocation. An allocation
shell (``sbatch`` script, ``salloc``) has only the job-scoped ones.

Every other module of unirank names a Slurm variable through this one (tests/test_layout_rules.py
keeps it so). The readers here take a mapping, never ``os.environ`` itself.

Reads (each function says which): SLURM_JOB_ID / SLURM_JOBID, SLURM_STEP_ID / SLURM_STEPID,
SLURM_RESTART_COUNT.
"""

from __future__ import annotations

from collections.abc import Mapping

from unirank.envvars import first_set

__all__ = [
    "ARRAY_JOB_ID",
    "ARRAY_TASK_ID",
    "GPUS_PER_TASK",
    "JOB_END_TIME",
    "JOB_ID",
    "JOB_NODELIST",
    "JOB_NUM_NODES",
    "JOB_NUM_TASKS",
    "LOCALID",
    "NODEID",
    "NODENAME",
    "PROCID",
    "RESTART_COUNT",
    "STEP_ID",
    "STEP_NODELIST",
    "STEP_NUM_NODES",
    "STEP_NUM_TASKS",
    "STEP_TASKS_PER_NODE",
    "TRES_BIND",
    "in_job",
    "job_id",
    "restart_count",
    "step_id",
]

#: the job's id (the older spelling last)
JOB_ID = ("SLURM_JOB_ID", "SLURM_JOBID")
#: the step's id: set only inside a step
STEP_ID = ("SLURM_STEP_ID", "SLURM_STEPID")
#: the task's rank in its step (an allocation shell has it too, as 0)
PROCID = "SLURM_PROCID"
#: the task's rank on its node
LOCALID = "SLURM_LOCALID"
#: the node's index in the step
NODEID = "SLURM_NODEID"
#: slurmd's name for this node (set in batch scripts and tasks, not in an salloc shell)
NODENAME = "SLURMD_NODENAME"

#: a step's nodes, tasks, node count and tasks per node
STEP_NODELIST = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
STEP_NUM_TASKS = ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS")
STEP_NUM_NODES = ("SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES")
STEP_TASKS_PER_NODE = ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")

#: the allocation's nodes, tasks and node count
JOB_NODELIST = ("SLURM_JOB_NODELIST", "SLURM_NODELIST")
JOB_NUM_TASKS = ("SLURM_NTASKS", "SLURM_NPROCS")
JOB_NUM_NODES = ("SLURM_JOB_NUM_NODES", "SLURM_NNODES")

#: an array job's id and this task's index in it (set only in an array task)
ARRAY_JOB_ID = "SLURM_ARRAY_JOB_ID"
ARRAY_TASK_ID = "SLURM_ARRAY_TASK_ID"
#: how many times the job was requeued before this run
RESTART_COUNT = "SLURM_RESTART_COUNT"
#: when the job's time limit ends, in seconds since the epoch (Slurm 21.08 and later)
JOB_END_TIME = "SLURM_JOB_END_TIME"

#: GPUs bound to each task (``srun --gpus-per-task``): a count, or ``type:count``
GPUS_PER_TASK = "SLURM_GPUS_PER_TASK"
#: slurmd's resource binding of a task (``gpu:per_task:N`` under ``--gpus-per-task``; Slurm
#: 22.05's srun exports this one but not GPUS_PER_TASK)
TRES_BIND = "SLURMD_TRES_BIND"


def job_id(environ: Mapping[str, str]) -> tuple[str | None, str]:
    """The Slurm job id and the variable it came from (``(None, "")`` outside a job).

    Reads: SLURM_JOB_ID, SLURM_JOBID.
    """
    name = first_set(environ, *JOB_ID)
    return (environ[name], name) if name else (None, "")


def step_id(environ: Mapping[str, str]) -> tuple[str | None, str]:
    """The Slurm step id and the variable it came from (``(None, "")`` outside a step).

    Reads: SLURM_STEP_ID, SLURM_STEPID.
    """
    name = first_set(environ, *STEP_ID)
    return (environ[name], name) if name else (None, "")


def in_job(environ: Mapping[str, str]) -> bool:
    """True in a Slurm job: a job id that is not blank. Reads: SLURM_JOB_ID, SLURM_JOBID."""
    return bool((job_id(environ)[0] or "").strip())


def restart_count(environ: Mapping[str, str]) -> int:
    """How many times the job was requeued before this run (0 when unset or not a number).

    Reads: SLURM_RESTART_COUNT.
    """
    count = environ.get(RESTART_COUNT, "0").strip()
    return int(count) if count.isdigit() else 0
