"""Submitting a batch script and asking Slurm how the job is doing (``sbatch``, ``scontrol``,
``sacct``, ``scancel``). The parsers are pure; the other functions run one Slurm command each
through :func:`unirank.slurmcmd.run_slurm`, the one runner of Slurm commands in unirank (also
for :mod:`unirank.runtime.preemption`'s ``squeue`` and ``scontrol``), with its one timeout,
:data:`~unirank.slurmcmd.COMMAND_TIMEOUT_S`.

Reads: PATH (to find the commands), or the ``environ`` a caller passes.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from typing import Optional

from unirank.errors import ConfigError
from unirank.exitcodes import killed_by
from unirank.slurmcmd import (
    COMMAND_TIMEOUT_S,
    REQUEUE_STATES,
    TERMINAL_STATES,
    JobInfo,
    parse_sacct,
    parse_scontrol,
    run_slurm,
)

__all__ = [
    "COMMAND_TIMEOUT_S",
    "REQUEUE_STATES",
    "TERMINAL_STATES",
    "JobInfo",
    "cancel",
    "exit_status",
    "job_info",
    "parse_sacct",
    "parse_scontrol",
    "require_program",
    "run_slurm",
    "submit",
]

def require_program(name: str) -> str:
    """The path of Slurm's ``name`` command, or a ConfigError with the login-node hint.

    Reads: PATH.
    """
    found = shutil.which(name)
    if found is None:
        raise ConfigError(
            f"{name} is not on PATH: this machine cannot submit to Slurm",
            hint="run unirank sbatch on a login node of the cluster, or use --dry-run to print "
            "the script",
        )
    return found


def job_info(job_id: str) -> Optional[JobInfo]:
    """The job's state from ``scontrol``, else (once the controller forgot it) ``sacct``."""
    shown = run_slurm(["scontrol", "show", "job", "-o", job_id])
    info = parse_scontrol(shown.stdout) if shown.returncode == 0 else None
    if info is not None or shutil.which("sacct") is None:
        return info
    acct = run_slurm(["sacct", "-X", "-n", "-P", "-o", "State,ExitCode,NodeList", "-j", job_id])
    return parse_sacct(acct.stdout) if acct.returncode == 0 else None


def exit_status(info: JobInfo) -> int:
    """The exit code ``--follow`` ends with: the batch script's, 128 + N for signal N, else 1
    for a job that ended badly with code 0 (cancelled, timed out)."""
    if info.state == "COMPLETED" and info.exit_code == 0:
        return 0
    if info.exit_code:
        return info.exit_code
    return killed_by(info.signal) if info.signal else 1


def submit(script: str, environ: Mapping[str, str], sbatch: str = "sbatch") -> tuple[str, str]:
    """Submit ``script`` (on sbatch's stdin): ``(job id, sbatch's --parsable answer)``.

    A refusal by sbatch is a ConfigError carrying sbatch's own message.
    """
    done = run_slurm([sbatch, "--parsable"], environ=environ, stdin=script)
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()] or ["(no message)"]
        raise ConfigError(f"sbatch refused the job: {lines[-1].strip()}",
                          hint="fix the option it names (unirank sbatch --dry-run shows the "
                          "script)")
    answer = done.stdout.strip()
    return answer.split(";", 1)[0], answer


def cancel(job_id: str) -> bool:
    """``scancel JOB``; True when Slurm accepted it."""
    return run_slurm(["scancel", job_id]).returncode == 0
