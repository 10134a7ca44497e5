"""Ranks started by Open MPI's ``mpirun``/``mpiexec`` (also ``prterun`` in Open MPI 5).

``OMPI_COMM_WORLD_NODE_RANK`` is *not* the node's index (it is the rank's index among the ranks
of its node, across jobs), so it is not used.
"""

from __future__ import annotations

from collections.abc import Mapping

from unirank.distenv import DistEnv
from unirank.launchers._base import Context, Launcher
from unirank.launchers._mpi import MpiVars, build

NAME = "openmpi"
VARS = MpiVars(
    rank="OMPI_COMM_WORLD_RANK",
    size="OMPI_COMM_WORLD_SIZE",
    local_rank=("OMPI_COMM_WORLD_LOCAL_RANK",),
    local_size=("OMPI_COMM_WORLD_LOCAL_SIZE",),
    job_id=("OMPI_MCA_ess_base_jobid", "OMPI_MCA_orte_ess_jobid", "PMIX_NAMESPACE"),
)


def detect(environ: Mapping[str, str], ctx: Context) -> DistEnv | None:
    """An Open MPI rank, or None.

    Reads: OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK,
    OMPI_COMM_WORLD_LOCAL_SIZE, OMPI_MCA_ess_base_jobid, PMIX_NAMESPACE, and what
    :func:`unirank.launchers._mpi.build` reads.
    """
    if VARS.rank not in environ and VARS.size not in environ:
        return None
    return build(NAME, VARS, environ, ctx)


LAUNCHER = Launcher(NAME, detect, keys=(VARS.rank, VARS.size))
