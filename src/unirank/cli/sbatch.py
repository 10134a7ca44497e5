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
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from unirank.cli.usage import one_line_errors
from unirank.errors import ConfigError
from unirank.sbatch.options import OPTIONS, add_job_options
from unirank.sbatch.spec import JobSpec

_EPILOG = (
    "Examples: unirank sbatch -N 2 --ntasks-per-node 4 --gpus-per-node 4 -t 2:00:00 train.py "
    "| unirank sbatch -N 2 --ntasks-per-node 2 --submit --follow -- hello.py --backend gloo "
    "| unirank sbatch --config job.toml --requeue --submit train.py --epochs 10. "
    "Pass any other #SBATCH option as --sbatch-arg=--exclusive (with '=')."
)


def _command_options(parser: argparse.ArgumentParser) -> None:
    """The options for what unirank sbatch does with the job (the job's own are
    :data:`unirank.sbatch.options.OPTIONS`)."""
    add = parser.add_argument
    add("--config", metavar="FILE", help="TOML file of defaults; flags win")
    add("--dry-run", action="store_true", help="print the script (the default)")
    add("--submit", action="store_true", help="submit the script with sbatch")
    add("--parsable", action="store_true", help="with --submit: print the job id alone")
    add("--follow", action="store_true",
        help="with --submit: stream the job's output until it ends; exit with its exit code "
        "(130 when Ctrl-C detached from the job, which goes on)")
    add("-m", "--module", action="store_true", help="run MODULE as python -m does")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``unirank sbatch`` (sbatch's names) and the script with its arguments."""
    parser.epilog = _EPILOG
    parser.allow_abbrev = False  # sbatch's --ntasks must not pass for --ntasks-per-node
    add_job_options(parser)
    _command_options(parser)
    parser.add_argument("program", metavar="SCRIPT|MODULE", nargs="?",
                        help="the script (or module with -m) every rank runs")
    parser.add_argument("program_args", nargs=argparse.REMAINDER, metavar="ARGS",
                        help="arguments for the script")
    one_line_errors(parser, _hint_for)


def _hint_for(message: str) -> str | None:
    """sbatch's own hint: an option of sbatch given to --sbatch-arg without '='."""
    return "write the sbatch option after '=': --sbatch-arg=--exclusive" \
        if "--sbatch-arg" in message else None


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
    from unirank.sbatch.spec import check_spec, parse_env, parse_nodes

    flags: dict[str, Any] = {option.field: getattr(args, option.dest) for option in OPTIONS}
    defaults = read_config(args.config) if args.config else {}
    merged = merge(defaults, flags)
    merged["env"] = parse_env(tuple(merged.get("env", ())))
    merged["nodes"], merged["min_nodes"] = parse_nodes(merged.get("nodes", 1))
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
