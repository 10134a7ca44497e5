"""Ranks started by MVAPICH2's ``mpirun_rsh`` / ``mpiexec``."""

from __future__ import annotations

from collections.abc import Mapping

from unirank.distenv import DistEnv
from unirank.launchers._base import Context, Launcher
from unirank.launchers._mpi import MpiVars, build

NAME = "mvapich"
VARS = MpiVars(
    rank="MV2_COMM_WORLD_RANK",
    size="MV2_COMM_WORLD_SIZE",
    local_rank=("MV2_COMM_WORLD_LOCAL_RANK",),
    local_size=("MV2_COMM_WORLD_LOCAL_SIZE",),
)


def detect(environ: Mapping[str, str], ctx: Context) -> DistEnv | None:
    """An MVAPICH rank, or None.

    Reads: MV2_COMM_WORLD_RANK, MV2_COMM_WORLD_SIZE, MV2_COMM_WORLD_LOCAL_RANK,
    MV2_COMM_WORLD_LOCAL_SIZE, and what :func:`unirank.launchers._mpi.build` reads.
    """
    if VARS.rank not in environ and VARS.size not in environ:
        return None
    return build(NAME, VARS, environ, ctx)


LAUNCHER = Launcher(NAME, detect, keys=(VARS.rank, VARS.size))
