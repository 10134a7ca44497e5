"""Inside a Slurm allocation shell (``sbatch`` script, ``salloc``) with no step: go through srun.

``unirank run`` there is alone on the first node; it needs one copy of itself on every node. It
re-executes itself as ``srun --nodes=N --ntasks=N --ntasks-per-node=1 ... unirank run ...``,
saying so on one line, unless UNIRANK_NO_SRUN=1, in which case it fails at once with the exact
srun command to use. It never waits for anything here.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from collections.abc import Mapping, Sequence
from typing import NoReturn

from unirank.contract import NO_SRUN_VAR, flag
from unirank.contract import SRUN_REEXEC_VAR as REEXEC_VAR
from unirank.errors import ConfigError
from unirank.launchers.slurm_vars import STEP_ID

__all__ = ["NO_SRUN_VAR", "REEXEC_VAR", "reexec_through_srun", "srun_command"]


def srun_command(nnodes: int, inner: Sequence[str]) -> list[str]:
    """``srun`` starting ``inner`` once on each of ``nnodes`` nodes.

    ``--kill-on-bad-exit=1`` ends the step when one node's ``unirank run`` fails. No CPU or GPU
    options: a step without them gets all of the job's CPUs and GPUs on each node, which the
    node's workers share.
    """
    return [
        "srun",
        f"--nodes={nnodes}",
        f"--ntasks={nnodes}",
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=1",
        *inner,
    ]


def reexec_through_srun(
    nnodes: int, inner: Sequence[str], environ: Mapping[str, str]
) -> NoReturn:
    """Replace this process with the srun step, or raise ConfigError with the command to use.

    Reads: UNIRANK_NO_SRUN, UNIRANK_SRUN_REEXEC, PATH.
    """
    command = srun_command(nnodes, inner)
    shown = shlex.join(command)
    if flag(environ, REEXEC_VAR):
        raise ConfigError(
            "unirank run was started by srun but still sees an allocation shell with no step",
            variable=STEP_ID[0], value=environ.get(STEP_ID[0]),
            hint="report this; meanwhile pass --nnodes and --node-rank explicitly",
        )
    if flag(environ, NO_SRUN_VAR):
        raise ConfigError(
            "this is a Slurm allocation shell with no step, and UNIRANK_NO_SRUN forbids "
            "starting one",
            variable=NO_SRUN_VAR, value=environ.get(NO_SRUN_VAR),
            hint=f"run: {shown}",
        )
    srun = shutil.which("srun", path=environ.get("PATH"))
    if srun is None:
        raise ConfigError(
            "this is a Slurm allocation shell with no step, and srun is not on PATH",
            variable="PATH", value=environ.get("PATH"),
            hint=f"put Slurm's bin directory on PATH and run: {shown}",
        )
    print(f"unirank run: no Slurm step here; starting one per node: {shown}",
          file=sys.stderr, flush=True)
    env = dict(environ)
    env[REEXEC_VAR] = "1"
    sys.stdout.flush()
    os.execve(srun, [srun, *command[1:]], env)
