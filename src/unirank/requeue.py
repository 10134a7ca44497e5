"""The pure parts of the stop -> checkpoint -> requeue pattern: the cap on requeues, squeue's
time format, the job to requeue, whether Slurm is already ending or requeueing the run.

A rank that saved its checkpoint and stops so that the job runs again exits with
:data:`unirank.exitcodes.REQUEUE` (79; why 79: :mod:`unirank.exitcodes`). The batch script that
``unirank sbatch --requeue`` writes checks the step's exit status and, on this code, requeues
the job from the batch shell (``scontrol requeue``), which also works where the ranks run in a
container without ``scontrol``. Which signals ask the ranks to stop:
:func:`unirank.signals.stop_signals`.

:mod:`unirank.runtime.preemption` is the part the training loop calls. Outside ``sbatch/``, so
that the runtime needs nothing of ``unirank sbatch``.
"""

from __future__ import annotations

from collections.abc import Mapping

from unirank.contract import DEFAULT_MAX_REQUEUES, MAX_REQUEUES_VAR
from unirank.errors import ConfigError
from unirank.launchers import slurm_vars as V
from unirank.slurmcmd import parse_scontrol

__all__ = [
    "max_requeues",
    "parse_time_left",
    "requeue_refusal",
    "requeue_target",
    "slurm_run_state",
]



# -- the pure parts of stop -> checkpoint -> requeue (runtime.preemption does the rest) --------


def parse_time_left(text: str) -> float | None:
    """Seconds in squeue's ``%L`` (``D-HH:MM:SS``, ``HH:MM:SS``, ``MM:SS``); None for
    ``UNLIMITED``, ``NOT_SET``, ``INVALID`` or anything else."""
    text = text.strip()
    days = 0
    if "-" in text:
        head, text = text.split("-", 1)
        if not head.isdigit():
            return None
        days = int(head)
    parts = text.split(":")
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        return None
    seconds = 0
    for part in parts:
        seconds = seconds * 60 + int(part)
    if days and len(parts) < 3:  # D-HH or D-HH:MM
        seconds *= 60 ** (3 - len(parts))
    return float(days * 86400 + seconds)


def requeue_target(environ: Mapping[str, str]) -> str | None:
    """The job ``scontrol requeue`` names: ``ARRAYJOB_TASK`` for an array task (it requeues
    only itself), else the job id; None outside Slurm.

    Reads: SLURM_JOB_ID / SLURM_JOBID, SLURM_ARRAY_JOB_ID, SLURM_ARRAY_TASK_ID.
    """
    job = V.job_id(environ)[0]
    if not job:
        return None
    array, task = environ.get(V.ARRAY_JOB_ID), environ.get(V.ARRAY_TASK_ID)
    return f"{array}_{task}" if array and task else job


def max_requeues(environ: Mapping[str, str]) -> int:
    """UNIRANK_MAX_REQUEUES (0 or more), default :data:`DEFAULT_MAX_REQUEUES`.

    Reads: UNIRANK_MAX_REQUEUES.
    """
    given = environ.get(MAX_REQUEUES_VAR, "").strip()
    if not given:
        return DEFAULT_MAX_REQUEUES
    if not given.isdigit():
        raise ConfigError("is not a whole number, 0 or more", variable=MAX_REQUEUES_VAR,
                          value=given, hint="give how many times the job may be requeued")
    return int(given)


def requeue_refusal(environ: Mapping[str, str]) -> str | None:
    """The one line that stops a job requeued too often (SLURM_RESTART_COUNT at the cap),
    else None.

    Reads: SLURM_JOB_ID / SLURM_JOBID, SLURM_RESTART_COUNT, UNIRANK_MAX_REQUEUES.
    """
    if not V.in_job(environ):
        return None
    cap = max_requeues(environ)
    count = V.restart_count(environ)
    if count < cap:
        return None
    return (f"unirank: not requeueing job {requeue_target(environ)} again: it ran "
            f"{count + 1} times ({V.RESTART_COUNT}={count}, {MAX_REQUEUES_VAR}={cap}); "
            f"raise {MAX_REQUEUES_VAR} if it needs more runs to finish")


def slurm_run_state(show_job: str, environ: Mapping[str, str]) -> str:
    """What Slurm is doing with this run, from ``scontrol show job -o JOB``'s line (read by
    :func:`unirank.slurmcmd.parse_scontrol`):

    * ``"requeued"``: Slurm has requeued the job (``scontrol requeue``, preemption): its
      ``Restarts`` is past this run's SLURM_RESTART_COUNT; it runs again by itself;
    * ``"running"``: the job runs (a stop asked by a signal or the time left), or scontrol said
      nothing: unirank requeues it;
    * ``"ending"``: Slurm is ending it for good (scancel, the time limit, a node's failure):
      it must not be requeued.

    Reads: SLURM_RESTART_COUNT.
    """
    info = parse_scontrol(show_job)
    if info is None:
        return "running"
    if info.restarts > V.restart_count(environ):
        return "requeued"
    return "running" if info.state in ("RUNNING", "CONFIGURING", "SUSPENDED") else "ending"
