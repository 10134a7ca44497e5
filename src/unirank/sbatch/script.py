"""The batch script of a :class:`~unirank.sbatch.spec.JobSpec`: :func:`render`, a pure function.

The script has one commented block per job: the ``#SBATCH`` header (what the job asks of Slurm),
the environment, the user's setup lines, the rendezvous written out (``--explicit-env`` only),
the launch, and (``--requeue`` only) the requeue from the batch shell. It holds no
MASTER_ADDR/MASTER_PORT lines unless asked: every rank derives them (:mod:`unirank.rendezvous`).
"""

from __future__ import annotations

import shlex
from pathlib import PurePath

from unirank.launchers import slurm_vars as V
from unirank.sbatch.requeue import REQUEUE_EXIT_CODE
from unirank.sbatch.spec import JobSpec, signal_for_batch_shell

__all__ = ["default_job_name", "render"]

_RULE_WIDTH = 96


def _block(title: str) -> str:
    head = f"# --- {title} "
    return head + "-" * max(3, _RULE_WIDTH - len(head))


def default_job_name(spec: JobSpec) -> str:
    """``--job-name`` when none is given: the script's stem, or the module's last part."""
    if spec.module:
        return spec.program.rsplit(".", 1)[-1] or "unirank"
    return PurePath(spec.program).stem or "unirank"


def _slurm_tasks(spec: JobSpec) -> tuple[int, int | None]:
    """Slurm tasks per node and CPUs per Slurm task for the launch mode."""
    if spec.launch == "node":
        cpus = spec.cpus_per_task * spec.tasks_per_node if spec.cpus_per_task else None
        return 1, cpus
    return spec.tasks_per_node, spec.cpus_per_task


def _header(spec: JobSpec) -> list[str]:
    per_node, cpus = _slurm_tasks(spec)
    what = ("one Slurm task per node, each running unirank run"
            if spec.launch == "node" else "one Slurm task per rank")
    lines = [_block("Slurm options: what the job asks for"),
             f"# {spec.nodes} node(s) x {spec.tasks_per_node} rank(s) = "
             f"{spec.nodes * spec.tasks_per_node} ranks, {what}."]
    options: list[tuple[str, object]] = [
        ("job-name", spec.job_name or default_job_name(spec)),
        ("nodes", spec.nodes), ("ntasks-per-node", per_node), ("cpus-per-task", cpus),
        ("gpus-per-node", spec.gpus_per_node or None), ("mem", spec.mem),
        ("time", spec.time), ("partition", spec.partition), ("account", spec.account),
        ("qos", spec.qos), ("constraint", spec.constraint), ("output", spec.output),
        ("error", spec.error),
    ]
    lines += [f"#SBATCH --{name}={value}" for name, value in options if value is not None]
    if spec.requeue:
        lines += ["# Requeue on preemption or on request; append to the log so that it keeps",
                  "# every run, and warn the ranks before the time limit.",
                  "#SBATCH --requeue", "#SBATCH --open-mode=append"]
    warning = spec.warning_signal()
    if warning is not None:
        lines.append(f"#SBATCH --signal={warning}")
    names = spec.passed_names()
    if names:
        lines += ["# Passed from the submitting shell by name: their values stay out of "
                  "this script.", f"#SBATCH --export=ALL,{','.join(names)}"]
    if spec.sbatch_args:
        lines.append("# Passed through as given (--sbatch-arg).")
        lines += [f"#SBATCH {arg}" for arg in spec.sbatch_args]
    return lines


def _environment(spec: JobSpec) -> list[str]:
    threads = spec.cpus_per_task or 1
    why = ("One OpenMP thread per CPU of a rank (--cpus-per-task)" if spec.cpus_per_task
           else "One OpenMP thread per rank (no --cpus-per-task given), as torchrun does")
    lines = [_block("Environment"), f"# {why}.", f"export OMP_NUM_THREADS={threads}"]
    lines += [f"export {name}={shlex.quote(value)}" for name, value in spec.set_values()]
    if not spec.explicit_env:
        lines += ["# No MASTER_ADDR/MASTER_PORT: every rank derives them (the job's first "
                  "node; the port", "# from the job id), see unirank.rendezvous."]
    return lines


def _setup(spec: JobSpec) -> list[str]:
    if not spec.setup:
        return []
    return [_block("Setup (--setup), run in this order before the launch"), *spec.setup]


def _explicit_env(spec: JobSpec) -> list[str]:
    if not spec.explicit_env:
        return []
    python = shlex.quote(spec.python)
    return [
        _block("Rendezvous, written out (--explicit-env)"),
        "# The values every rank would derive without these lines: rank 0's host is the",
        "# job's first node, the port comes from the job id and the first srun step",
        "# (unirank.rendezvous).",
        f'export MASTER_ADDR="$({python} -m unirank.sbatch.jobenv MASTER_ADDR)"',
        f'export MASTER_PORT="$({python} -m unirank.sbatch.jobenv MASTER_PORT)"',
        'echo "unirank sbatch: MASTER_ADDR=$MASTER_ADDR MASTER_PORT=$MASTER_PORT"',
    ]


def _command(spec: JobSpec) -> tuple[str, str]:
    """Why, and the srun line (srun's --quiet: no notes of its own on a stop or requeue)."""
    target = (["-m", spec.program] if spec.module else [spec.program]) + list(spec.program_args)
    if spec.launch == "node":
        why = (f"# srun starts one task per node; each runs unirank run, which starts "
               f"{spec.tasks_per_node} rank(s) there.")
        command = [spec.python, "-m", "unirank", "run", "--nproc-per-node",
                   str(spec.tasks_per_node), *target]
    else:
        why = "# srun starts one task per rank; each finds its rank, world and master from Slurm."
        command = [spec.python, *target]
    return why, "srun --quiet " + shlex.join(command)


def _waited(spec: JobSpec, srun: str) -> list[str]:
    """srun in the background, waited for by a batch shell that traps Slurm's SIGTERM (and
    forwards a ``B:`` warning signal to srun, which passes it to the ranks)."""
    forwarded = signal_for_batch_shell(spec.warning_signal() or "")
    lines = [
        "# Slurm ends a run (scancel, a requeue, preemption, the time limit) with SIGTERM to",
        "# every process of the job: the ranks save their checkpoint and stop; this shell waits",
        "# for them and leaves the requeue to Slurm.",
        'ended=""',
        "trap 'ended=TERM' TERM",
    ]
    if forwarded is not None:
        lines += [f"# --signal B:{forwarded} comes to this shell alone: pass it to srun, which "
                  "passes it to the ranks.",
                  "# ($! is srun as soon as it starts; $srun_pid may not be set yet)",
                  f"trap 'kill -{forwarded} \"$!\" 2>/dev/null' {forwarded}"]
    return [
        *lines,
        f"{srun} &",
        "srun_pid=$!",
        "# Traps run between polls (a trap that ends a wait early can lose srun's status);",
        "# Slurm's SIGTERM ends a poll's sleep too: no job message for it.",
        'while kill -0 "$srun_pid" 2>/dev/null; do { sleep 1; } 2>/dev/null; done',
        'wait "$srun_pid"',
        "status=$?",
    ]


def _launch(spec: JobSpec) -> list[str]:
    why, srun = _command(spec)
    if spec.requeue or signal_for_batch_shell(spec.warning_signal() or "") is not None:
        return [_block("Launch"), why, *_waited(spec, srun)]
    return [_block("Launch"), why, srun, "status=$?"]


def _requeue(spec: JobSpec) -> list[str]:
    if not spec.requeue:
        return []
    code = REQUEUE_EXIT_CODE
    return [
        _block("Requeue"),
        f"# Ranks that saved their checkpoint and stopped to run again exit with {code}",
        "# (unirank.sbatch.requeue). The batch shell requeues the job itself, which works where",
        "# the ranks run in a container without scontrol. An array task requeues only itself.",
        "# After Slurm's SIGTERM the requeue is Slurm's (a cancel must not be requeued).",
        f'if [ "$status" -eq {code} ] && [ -z "$ended" ]; then',
        f'    job="${V.JOB_ID[0]}"',
        f'    if [ -n "${{{V.ARRAY_JOB_ID}:-}}" ]; then',
        f'        job="${{{V.ARRAY_JOB_ID}}}_${{{V.ARRAY_TASK_ID}}}"',
        "    fi",
        f'    echo "unirank sbatch: stopped to be requeued (exit code {code}); requeueing job '
        '$job"',
        '    scontrol requeue "$job"',
        "fi",
    ]


def render(spec: JobSpec) -> str:
    """The batch script for ``spec`` (already checked by :func:`unirank.sbatch.spec.check_spec`).

    Pure: the same spec always gives the same text; nothing is read from the environment.
    """
    blocks = [
        ["#!/bin/bash",
         "# Batch script written by unirank sbatch; submit it with: sbatch SCRIPT"],
        _header(spec), _environment(spec), _setup(spec), _explicit_env(spec), _launch(spec),
        _requeue(spec), ['exit "$status"'],
    ]
    return "\n\n".join("\n".join(block) for block in blocks if block) + "\n"
