"""Slurm's variable names, in one place: which variables give which fact (first present wins).

Inside a step (a task ``srun`` started) the step-scoped names come first, because the job-scoped
ones (``SLURM_JOB_NODELIST``, ``SLURM_NNODES``) still describe the whole allocation. An allocation
shell (``sbatch`` script, ``salloc``) has only the job-scoped ones.
"""

from __future__ import annotations

__all__ = [
    "GPUS_PER_TASK",
    "JOB_ID",
    "JOB_NODELIST",
    "JOB_NUM_NODES",
    "JOB_NUM_TASKS",
    "LOCALID",
    "NODEID",
    "NODENAME",
    "PROCID",
    "STEP_ID",
    "STEP_NODELIST",
    "STEP_NUM_NODES",
    "STEP_NUM_TASKS",
    "STEP_TASKS_PER_NODE",
    "TRES_BIND",
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

#: GPUs bound to each task (``srun --gpus-per-task``): a count, or ``type:count``
GPUS_PER_TASK = "SLURM_GPUS_PER_TASK"
#: slurmd's resource binding of a task (``gpu:per_task:N`` under ``--gpus-per-task``; Slurm
#: 22.05's srun exports this one but not GPUS_PER_TASK)
TRES_BIND = "SLURMD_TRES_BIND"
