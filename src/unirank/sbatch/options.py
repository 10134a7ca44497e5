"""The options that set a ``unirank sbatch`` job: one table, read by the command line
(:mod:`unirank.cli.sbatch` adds each as an argparse option) and by the ``--config`` file
(:mod:`unirank.sbatch.config` takes each long name as a key, with its type).

Each :class:`JobOption` names its flags, the :class:`~unirank.sbatch.spec.JobSpec` field it
sets and its kind: ``int``, ``str``, ``bool`` (a flag without a value; ``true``/``false`` in the
file) or ``list`` (repeatable; a list of strings in the file). The options that say what
``unirank sbatch`` does rather than what the job is (``--config``, ``--dry-run``, ``--submit``,
``--parsable``, ``--follow``) and ``-m`` (which reads the program) are the command line's alone.

Reads no environment variable.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, Optional

from unirank.contract import ELASTIC_MAX_RESTARTS
from unirank.sbatch.spec import BACKENDS, DEFAULT_REQUEUE_SIGNAL, LAUNCH_MODES

__all__ = ["OPTIONS", "JobOption", "add_job_options"]


@dataclass(frozen=True)
class JobOption:
    """One option of the job: ``flags`` (the long one last), the JobSpec ``field``, its kind."""

    flags: tuple[str, ...]
    field: str
    kind: type
    metavar: Optional[str] = None
    help: Optional[str] = None

    @property
    def key(self) -> str:
        """The long name without dashes: the ``--config`` file's key (``ntasks-per-node``)."""
        return self.flags[-1].removeprefix("--")

    @property
    def dest(self) -> str:
        """argparse's attribute for it (``ntasks_per_node``)."""
        return self.key.replace("-", "_")

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        """Add it to ``parser``; not given, its value is None (the file's, or the default)."""
        kwargs: dict[str, Any] = {"help": self.help, "dest": self.dest}
        if self.kind is bool:
            kwargs.update(action="store_const", const=True)
        else:
            kwargs["metavar"] = self.metavar
            if self.kind is int:
                kwargs["type"] = int
            elif self.kind is list:
                kwargs["action"] = "append"
        parser.add_argument(*self.flags, **kwargs)


#: every option that sets the job, in the order ``unirank sbatch --help`` lists them
OPTIONS: tuple[JobOption, ...] = (
    JobOption(("-N", "--nnodes", "--nodes"), "nodes", str, "N|MIN:MAX",
              "number of nodes (default 1); a range MIN:MAX (or MIN-MAX) is an elastic job "
              "(--launch node): it starts on the nodes Slurm gives, and a lost node's survivors "
              "restart at the world left"),
    JobOption(("--ntasks-per-node",), "tasks_per_node", int, "N",
              "ranks per node (default 1); with --launch node, unirank run's --nproc-per-node"),
    JobOption(("--gpus-per-node",), "gpus_per_node", int, "G", "GPUs per node (default none)"),
    JobOption(("-c", "--cpus-per-task"), "cpus_per_task", int, "C",
              "CPUs per rank; also OMP_NUM_THREADS (default 1 thread)"),
    JobOption(("--mem",), "mem", str, "SIZE", "memory per node, e.g. 64G"),
    JobOption(("-t", "--time"), "time", str, "TIME",
              "time limit: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS"),
    JobOption(("-p", "--partition"), "partition", str, "NAME"),
    JobOption(("-A", "--account"), "account", str, "NAME"),
    JobOption(("-q", "--qos"), "qos", str, "NAME"),
    JobOption(("-J", "--job-name"), "job_name", str, "NAME", "default: the script's name"),
    JobOption(("-o", "--output"), "output", str, "PATTERN",
              "stdout file, e.g. logs/%%x-%%j.out"),
    JobOption(("-e", "--error"), "error", str, "PATTERN", "stderr file (default: with stdout)"),
    JobOption(("-C", "--constraint"), "constraint", str, "FEATURES"),
    JobOption(("--requeue",), "requeue", bool, None,
              "requeue on preemption or when the ranks stop to be requeued; appends to the log "
              f"and asks for a warning signal (default {DEFAULT_REQUEUE_SIGNAL})"),
    JobOption(("--signal",), "signal", str, "[{R|B}:]SIG[@SECONDS]",
              "warning signal before the time limit, in sbatch's syntax, e.g. USR2@120"),
    JobOption(("--sbatch-arg",), "sbatch_args", list, "OPTION",
              "any other #SBATCH option, written as given: --sbatch-arg=--exclusive "
              "(repeatable)"),
    JobOption(("--env",), "env", list, "NAME[=VALUE]",
              "set NAME=VALUE in the script, or pass NAME from this shell (--export); values "
              "of names with TOKEN, KEY, SECRET or PASSWORD are refused (repeatable)"),
    JobOption(("--setup",), "setup", list, "LINE",
              "a shell line run before the launch, e.g. 'module load cuda' (repeatable)"),
    JobOption(("--launch",), "launch", str, "|".join(LAUNCH_MODES),
              "node (default): one Slurm task per node running unirank run --nproc-per-node N "
              "SCRIPT, which gives each rank torchrun's environment; tasks: one Slurm task per "
              "rank running python SCRIPT, for scripts that find their rank from Slurm "
              "(ur.init)"),
    JobOption(("--max-restarts",), "max_restarts", int, "N",
              "with --launch node: unirank run's --max-restarts (default 0; "
              f"{ELASTIC_MAX_RESTARTS} with a range MIN:MAX)"),
    JobOption(("--rdzv-conf",), "rdzv_conf", str, "K=V,...",
              "with --nnodes MIN:MAX: unirank run's --rdzv-conf, torchrun's keys, e.g. "
              "last_call_timeout=5 (how long more nodes may join once MIN did; default 3); checked "
              "at submission"),
    JobOption(("--backend",), "backend", str, "|".join(BACKENDS),
              "the backend the script will use, for the GPU check (auto: nccl with a GPU "
              "per rank, else gloo)"),
    JobOption(("--python",), "python", str, "PYTHON",
              "the interpreter in the job (default: this one, the absolute path of the Python "
              "running unirank sbatch)"),
    JobOption(("--explicit-env",), "explicit_env", bool, None,
              "write MASTER_ADDR/MASTER_PORT lines (unirank derives them without)"),
)


def add_job_options(parser: argparse.ArgumentParser) -> None:
    """Add every option of :data:`OPTIONS` to ``parser``, in its order."""
    for option in OPTIONS:
        option.add_to(parser)
