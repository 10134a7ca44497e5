"""``unirank sbatch``: write the batch script of a distributed job, print it or submit it.

``unirank sbatch [options] [--] SCRIPT.py [ARGS...]`` or ``unirank sbatch [options] -m MODULE
[ARGS...]``: the options are named as sbatch's own; everything after SCRIPT goes to the script.
Without ``--submit`` the script is printed (``--dry-run``); with it, sbatch submits it and the
job id is printed (``--parsable``: alone); ``--follow`` then streams the job's output and ends
with its exit code. Every refusal happens before anything is submitted.

Reads: PATH (sbatch, scontrol, scancel), and with ``--submit`` the variables that ``--env NAME``
passes through (they must be set in this shell).
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NoReturn

from unirank.errors import ConfigError
from unirank.sbatch.spec import BACKENDS, DEFAULT_REQUEUE_SIGNAL, LAUNCH_MODES, JobSpec

_EPILOG = (
    "Examples: unirank sbatch -N 2 --ntasks-per-node 4 --gpus-per-node 4 -t 2:00:00 train.py "
    "| unirank sbatch -N 2 --ntasks-per-node 2 --submit --follow -- hello.py --backend gloo "
    "| unirank sbatch --config job.toml --requeue --submit train.py --epochs 10. "
    "Pass any other #SBATCH option as --sbatch-arg=--exclusive (with '=')."
)

#: option dest -> JobSpec field, for the options that a --config file may also set
_FIELDS = {
    "nodes": "nodes", "ntasks_per_node": "tasks_per_node", "gpus_per_node": "gpus_per_node",
    "cpus_per_task": "cpus_per_task", "mem": "mem", "time": "time", "partition": "partition",
    "account": "account", "qos": "qos", "job_name": "job_name", "output": "output",
    "error": "error", "constraint": "constraint", "requeue": "requeue", "signal": "signal",
    "env": "env", "setup": "setup", "launch": "launch", "sbatch_arg": "sbatch_args",
    "explicit_env": "explicit_env", "backend": "backend", "python": "python",
}


def _slurm_options(parser: argparse.ArgumentParser) -> None:
    """The options that become ``#SBATCH`` lines."""
    add = parser.add_argument
    add("-N", "--nodes", type=int, metavar="N", help="number of nodes (default 1)")
    add("--ntasks-per-node", type=int, metavar="N",
        help="ranks per node (default 1); with --launch node, unirank run's --nproc-per-node")
    add("--gpus-per-node", type=int, metavar="G", help="GPUs per node (default none)")
    add("-c", "--cpus-per-task", type=int, metavar="C",
        help="CPUs per rank; also OMP_NUM_THREADS (default 1 thread)")
    add("--mem", metavar="SIZE", help="memory per node, e.g. 64G")
    add("-t", "--time", metavar="TIME",
        help="time limit: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS")
    add("-p", "--partition", metavar="NAME")
    add("-A", "--account", metavar="NAME")
    add("-q", "--qos", metavar="NAME")
    add("-J", "--job-name", metavar="NAME", help="default: the script's name")
    add("-o", "--output", metavar="PATTERN", help="stdout file, e.g. logs/%%x-%%j.out")
    add("-e", "--error", metavar="PATTERN", help="stderr file (default: with stdout)")
    add("-C", "--constraint", metavar="FEATURES")
    add("--requeue", action="store_const", const=True,
        help="requeue on preemption or when the ranks stop to be requeued; appends to the log "
        f"and asks for a warning signal (default {DEFAULT_REQUEUE_SIGNAL})")
    add("--signal", metavar="[{R|B}:]SIG[@SECONDS]",
        help="warning signal before the time limit, in sbatch's syntax, e.g. USR2@120")
    add("--sbatch-arg", action="append", metavar="OPTION",
        help="any other #SBATCH option, written as given: --sbatch-arg=--exclusive (repeatable)")


def _job_options(parser: argparse.ArgumentParser) -> None:
    """The options for what runs in the job, and for what unirank sbatch does with it."""
    add = parser.add_argument
    add("--env", action="append", metavar="NAME[=VALUE]",
        help="set NAME=VALUE in the script, or pass NAME from this shell (--export); values of "
        "names with TOKEN, KEY, SECRET or PASSWORD are refused (repeatable)")
    add("--setup", action="append", metavar="LINE",
        help="a shell line run before the launch, e.g. 'module load cuda' (repeatable)")
    add("--launch", metavar="|".join(LAUNCH_MODES),
        help="tasks: one Slurm task per rank running python SCRIPT (default); node: one task "
        "per node running unirank run --nproc-per-node N SCRIPT")
    add("--backend", metavar="|".join(BACKENDS),
        help="the backend the script will use, for the GPU check (auto: nccl with a GPU "
        "per rank, else gloo)")
    add("--python", metavar="PYTHON",
        help="the interpreter in the job (default: this one, the absolute path of the Python "
        "running unirank sbatch)")
    add("--explicit-env", action="store_const", const=True,
        help="write MASTER_ADDR/MASTER_PORT lines (unirank derives them without)")
    add("--config", metavar="FILE", help="TOML file of defaults; flags win")
    add("--dry-run", action="store_true", help="print the script (the default)")
    add("--submit", action="store_true", help="submit the script with sbatch")
    add("--parsable", action="store_true", help="with --submit: print the job id alone")
    add("--follow", action="store_true",
        help="with --submit: stream the job's output until it ends; exit with its exit code")
    add("-m", "--module", action="store_true", help="run MODULE as python -m does")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``unirank sbatch`` (sbatch's names) and the script with its arguments."""
    parser.epilog = _EPILOG
    parser.allow_abbrev = False  # sbatch's --ntasks must not pass for --ntasks-per-node
    _slurm_options(parser)
    _job_options(parser)
    parser.add_argument("program", metavar="SCRIPT|MODULE", nargs="?",
                        help="the script (or module with -m) every rank runs")
    parser.add_argument("program_args", nargs=argparse.REMAINDER, metavar="ARGS",
                        help="arguments for the script")
    parser.error = _one_line_error(parser)  # type: ignore[method-assign]


def _long_options(parser: argparse.ArgumentParser) -> list[str]:
    return sorted(o for o in parser._option_string_actions if o.startswith("--"))


def _one_line_error(parser: argparse.ArgumentParser) -> Any:
    """argparse's ``error`` as one line naming the valid choices, exit status 2."""

    def error(message: str) -> NoReturn:
        valid = _long_options(parser)
        hint = "options go before SCRIPT; unirank sbatch --help describes them"
        if message.startswith("unrecognized arguments:"):
            unknown = message.split(":", 1)[1].split()[0]
            close = difflib.get_close_matches(unknown.split("=")[0], valid, n=1)
            guess = f" (did you mean {close[0]}?)" if close else ""
            message = f"unknown option {unknown}{guess}"
            hint = f"options go before SCRIPT; the valid ones: {' '.join(valid)}"
        elif "--sbatch-arg" in message:
            hint = "write the sbatch option after '=': --sbatch-arg=--exclusive"
        print(f"unirank sbatch: error: {message} HINT: {hint}", file=sys.stderr)
        sys.exit(2)

    return error


def _check_modes(args: argparse.Namespace) -> None:
    if args.dry_run and args.submit:
        raise ConfigError("--dry-run and --submit exclude each other",
                          hint="give --dry-run to print the script, or --submit to submit it")
    for flag, given in (("--follow", args.follow), ("--parsable", args.parsable)):
        if given and not args.submit:
            raise ConfigError(f"{flag} needs --submit",
                              hint=f"add --submit (or drop {flag} to print the script)")


def _check_program(args: argparse.Namespace) -> None:
    if args.program is None:
        raise ConfigError("no script or module to run",
                          hint="unirank sbatch [options] script.py [args...]  or  "
                          "unirank sbatch [options] -m module [args...]")
    if not args.module and not Path(args.program).is_file():
        raise ConfigError("is not a file", variable="SCRIPT", value=args.program,
                          hint=f"give the path of the script from {os.getcwd()}, or -m MODULE "
                          "for a module")


def default_python() -> str:
    """The interpreter the job runs when ``--python`` is not given: the one running unirank
    sbatch (so the job imports the same unirank), not whatever ``python`` the job's PATH finds."""
    return sys.executable or "python"


def build_spec(args: argparse.Namespace) -> JobSpec:
    """The checked JobSpec of the parsed options merged over the ``--config`` file."""
    from unirank.sbatch.config import merge, read_config
    from unirank.sbatch.spec import check_spec, parse_env

    flags: dict[str, Any] = {field: getattr(args, dest) for dest, field in _FIELDS.items()}
    defaults = read_config(args.config) if args.config else {}
    merged = merge(defaults, flags)
    merged["env"] = parse_env(tuple(merged.get("env", ())))
    merged.setdefault("python", default_python())
    program_args = list(args.program_args)
    if program_args and program_args[0] == "--":
        program_args = program_args[1:]
    spec = JobSpec(program=args.program, program_args=tuple(program_args),
                   module=bool(args.module), **merged)
    return check_spec(spec)


def _check_passed(spec: JobSpec, environ: Mapping[str, str]) -> None:
    missing = [name for name in spec.passed_names() if name not in environ]
    if missing:
        raise ConfigError(f"--env {missing[0]} passes a variable that is not set in this shell",
                          hint=f"export {missing[0]} before submitting, or drop --env "
                          f"{missing[0]}")


def _submit(spec: JobSpec, script: str, args: argparse.Namespace) -> int:
    """Submit ``script``; print the job id; follow it with ``--follow``.

    Reads: PATH, and the variables that ``--env NAME`` passes through.
    """
    from unirank.sbatch.commands import require_program, submit

    sbatch = require_program("sbatch")
    if args.follow:
        require_program("scontrol")
    environ = dict(os.environ)
    _check_passed(spec, environ)
    job_id, answer = submit(script, environ, sbatch=sbatch)
    print(answer if args.parsable else f"Submitted batch job {job_id}", flush=True)
    if not args.follow:
        return 0
    from unirank.sbatch.follow import follow

    return follow(job_id, ranks="rank" if spec.launch == "tasks" else "node task")


def main(args: argparse.Namespace) -> int:
    """Check the options, render the script, then print or submit it; the exit code."""
    from unirank.sbatch.script import render

    _check_modes(args)
    _check_program(args)
    spec = build_spec(args)
    script = render(spec)
    if not args.submit:
        sys.stdout.write(script)
        return 0
    return _submit(spec, script, args)
