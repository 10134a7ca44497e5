"""The batch script of a :class:`~unirank.sbatch.spec.JobSpec`: :func:`render`, a pure function.

The script has one commented block per job: the ``#SBATCH`` header (what the job asks of Slurm),
the environment, the user's setup lines, the rendezvous written out (``--explicit-env`` only),
the launch (for an elastic range ``--nnodes MIN:MAX``: the first node's ``unirank run`` and
the other nodes' in two steps, see :func:`_elastic`), and (``--requeue`` only) the requeue
from the batch shell. It holds no
MASTER_ADDR/MASTER_PORT lines unless asked: every rank derives them (:mod:`unirank.rendezvous`).
"""

from __future__ import annotations

import shlex
from pathlib import PurePath

from unirank.contract import RDZV_SECRET_FILE_VAR, RDZV_SECRET_VAR, STOP_SIGNALS_VAR
from unirank.exitcodes import REQUEUE as REQUEUE_EXIT_CODE
from unirank.launchers import slurm_vars as V
from unirank.sbatch.spec import JobSpec, rank_stop_signals, signal_for_batch_shell
from unirank.words import counted

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
    low, high = (spec.min_nodes or 0) * spec.tasks_per_node, spec.nodes * spec.tasks_per_node
    ranks = f"{low}-{high} ranks" if spec.elastic else counted(high, "rank")
    nodes = f"{spec.nodes_text('-')} nodes" if spec.elastic else counted(spec.nodes, "node")
    lines = [_block("Slurm options: what the job asks for"),
             f"# {nodes} x {counted(spec.tasks_per_node, 'rank')} = {ranks}, {what}."]
    options: list[tuple[str, object]] = [
        ("job-name", spec.job_name or default_job_name(spec)),
        # an elastic job asks no --ntasks-per-node: with it Slurm counts MIN x that many
        # tasks and gives MIN nodes (seen on Slurm 22.05); its steps start one task per node
        ("nodes", spec.nodes_text("-")), ("ntasks-per-node", None if spec.elastic else per_node),
        ("cpus-per-task", cpus),
        ("gpus-per-node", spec.gpus_per_node or None), ("mem", spec.mem),
        ("time", spec.time), ("partition", spec.partition), ("account", spec.account),
        ("qos", spec.qos), ("constraint", spec.constraint), ("output", spec.output),
        ("error", spec.error),
    ]
    lines += [f"#SBATCH --{name}={value}" for name, value in options if value is not None]
    if spec.elastic:
        lines += ["# Elastic: Slurm gives between the least and the most nodes; a node that fails",
                  "# ends neither the job nor its other nodes (the survivors go on without it).",
                  "#SBATCH --no-kill"]
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
    stop = rank_stop_signals(spec)
    if stop is not None:
        lines += [f"# The warning signal (--signal {spec.warning_signal()}) asks the ranks to "
                  "stop: ur.stop_requested()", "# sees it, and a rank does not die of it.",
                  f"export {STOP_SIGNALS_VAR}={stop}"]
    if spec.elastic:
        lines += ["# No MASTER_ADDR/MASTER_PORT: each rendezvous round gives them (the job's "
                  "first node;", "# a port it opens)."]
    elif not spec.explicit_env:
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


def _target(spec: JobSpec) -> list[str]:
    """What each rank runs: ``SCRIPT ARGS`` or ``-m MODULE ARGS``."""
    return (["-m", spec.program] if spec.module else [spec.program]) + list(spec.program_args)


def _command(spec: JobSpec) -> tuple[str, str]:
    """Why, and the srun line (srun's --quiet: no notes of its own on a stop or requeue)."""
    target = _target(spec)
    if spec.launch == "node":
        why = (f"# srun starts one task per node; each runs unirank run, which starts "
               f"{counted(spec.tasks_per_node, 'rank')} there.")
        command = [*_unirank_run(spec), *target]
    else:
        why = "# srun starts one task per rank; each finds its rank, world and master from Slurm."
        command = [spec.python, *target]
    return why, "srun --quiet " + shlex.join(command)


def _unirank_run(spec: JobSpec) -> list[str]:
    """``python -m unirank run`` and its options (``--launch node``), before the target."""
    restarts = spec.restarts()
    return [spec.python, "-m", "unirank", "run", "--nproc-per-node", str(spec.tasks_per_node),
            *(["--max-restarts", str(restarts)] if restarts is not None else [])]


def _elastic(spec: JobSpec) -> list[str]:
    """The launch of an elastic job: the rendezvous endpoint, then two sruns in the background
    (the first node's, whose exit status is the job's, and the other nodes'), waited for."""
    target = _target(spec)
    python = shlex.quote(spec.python)
    conf = ["--rdzv-conf", spec.rdzv_conf] if spec.rdzv_conf else []
    run = shlex.join(_unirank_run(spec)) + " " + shlex.join(
        ["--nnodes", spec.nodes_text(), "--rdzv-backend", "c10d", *conf])
    lines = [
        f"# Elastic (--nnodes {spec.nodes_text()}): one unirank run per node, meeting in "
        "unirank's dynamic",
        "# rendezvous served by the job's first node (node rank 0) at a port derived from the",
        "# job id (unirank.sbatch.jobenv); the job id is the rendezvous id. A lost node's",
        "# survivors stop their ranks within seconds and restart them at the world left; the",
        "# first node lost, the next takes the rendezvous over.",
        f'endpoint="$({python} -m unirank.sbatch.jobenv MASTER_ADDR):'
        f'$({python} -m unirank.sbatch.jobenv MASTER_PORT)"',
        "# The rendezvous's secret, made here for this job unless one was set: the steps pass it",
        "# to every node in their environment (never on a command line), so that a process that",
        "# only knows the endpoint cannot join or steer the job.",
        f'if [ -z "${{{RDZV_SECRET_VAR}:-}}${{{RDZV_SECRET_FILE_VAR}:-}}" ]; then',
        f'    {RDZV_SECRET_VAR}="$({python} -m unirank.sbatch.jobenv RDZV_SECRET)"',
        f"    export {RDZV_SECRET_VAR}",
        "fi",
        "# Two steps: the first node's, whose exit status is the job's (srun's own would be the",
        "# worst task's: 137 for a node killed although the others finished), and the other",
        "# nodes'. --no-kill: a failed node does not end the step; --kill-on-bad-exit=0 and",
        "# --wait=0: a node's end ends no other node's (whatever KillOnBadExit and WaitTime the",
        "# site's slurm.conf sets).",
        "elastic() {",
        '    srun --quiet --no-kill --kill-on-bad-exit=0 --wait=0 --ntasks-per-node=1 "$@" \\',
        f"        {run} \\",
        f'        --rdzv-endpoint "$endpoint" --rdzv-id "${V.JOB_ID[0]}" {shlex.join(target)}',
        "}",
    ]
    start = [
        "elastic --nodes=1 --relative=0 &",
        "srun_pid=$!",
        'others=""',
        f'if [ "${{{V.JOB_NUM_NODES[0]}:-1}}" -gt 1 ]; then',
        f'    elastic --nodes="$(({V.JOB_NUM_NODES[0]} - 1))" --relative=1 &',
        "    others=$!",
        "fi",
    ]
    rest = [
        "# The other nodes end with the first node's run: they have 30 s more, then the job's",
        "# end stops them. The first node lost (not stopped by Slurm), they go on without it:",
        "# their status is the job's then.",
        'if [ -n "$others" ] && [ "$status" -ne 0 ] && [ -z "$ended" ]; then',
        '    while kill -0 "$others" 2>/dev/null; do { sleep 1; } 2>/dev/null; done',
        '    wait "$others"',
        "    status=$?",
        'elif [ -n "$others" ]; then',
        '    for _ in $(seq 30); do kill -0 "$others" 2>/dev/null || break; '
        "{ sleep 1; } 2>/dev/null; done",
        "fi",
    ]
    return [*lines, *_waited(spec, start, "$srun_pid $others"), *rest]


def _waited(spec: JobSpec, start: list[str], pids: str = '"$!"') -> list[str]:
    """``start`` (srun in the background, its pid in ``srun_pid``), waited for by a batch
    shell that traps Slurm's SIGTERM (and forwards a ``B:`` warning signal to ``pids``: srun,
    which passes it to the ranks)."""
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
                  *(["# ($! is srun as soon as it starts; $srun_pid may not be set yet)"]
                    if pids == '"$!"' else []),
                  f"trap 'kill -{forwarded} {pids} 2>/dev/null' {forwarded}"]
    return [
        *lines,
        *start,
        "# Traps run between polls (a trap that ends a wait early can lose srun's status);",
        "# Slurm's SIGTERM ends a poll's sleep too: no job message for it.",
        'while kill -0 "$srun_pid" 2>/dev/null; do { sleep 1; } 2>/dev/null; done',
        'wait "$srun_pid"',
        "status=$?",
    ]


def _launch(spec: JobSpec) -> list[str]:
    if spec.elastic:
        return [_block("Launch"), *_elastic(spec)]
    why, srun = _command(spec)
    if spec.requeue or signal_for_batch_shell(spec.warning_signal() or "") is not None:
        return [_block("Launch"), why, *_waited(spec, [f"{srun} &", "srun_pid=$!"])]
    return [_block("Launch"), why, srun, "status=$?"]


def _requeue(spec: JobSpec) -> list[str]:
    if not spec.requeue:
        return []
    code = REQUEUE_EXIT_CODE
    return [
        _block("Requeue"),
        f"# Ranks that saved their checkpoint and stopped to run again exit with {code}",
        "# (unirank.exitcodes). The batch shell requeues the job itself, which works where",
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
