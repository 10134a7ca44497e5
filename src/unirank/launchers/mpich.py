"""Ranks started through the PMI interface: MPICH's Hydra ``mpiexec``, Intel MPI, Cray PALS.

Hydra sets ``PMI_RANK``, ``PMI_SIZE``, ``MPI_LOCALRANKID`` and ``MPI_LOCALNRANKS``; Cray's PALS
``mpiexec`` sets ``PMI_LOCAL_RANK`` and ``PMI_LOCAL_SIZE`` instead of the last two. The launcher is
reported as ``intelmpi`` when Intel MPI's ``I_MPI_`` variables are present.
"""

from __future__ import annotations

from collections.abc import Mapping

from unirank.distenv import DistEnv
from unirank.launchers._base import Context, Launcher
from unirank.launchers._mpi import MpiVars, build

NAME = "mpich"
INTEL_NAME = "intelmpi"
VARS = MpiVars(
    rank="PMI_RANK",
    size="PMI_SIZE",
    local_rank=("MPI_LOCALRANKID", "PMI_LOCAL_RANK"),
    local_size=("MPI_LOCALNRANKS", "PMI_LOCAL_SIZE"),
    job_id=("PMI_JOBID", "PMI_KVSNAME", "PALS_APID"),
)


def is_intel(environ: Mapping[str, str]) -> bool:
    """True when Intel MPI's own variables are present (``I_MPI_*``)."""
    return any(name.startswith("I_MPI_") for name in environ)


def detect(environ: Mapping[str, str], ctx: Context) -> DistEnv | None:
    """An MPICH-family rank, or None.

    Reads: PMI_RANK, PMI_SIZE, MPI_LOCALRANKID / PMI_LOCAL_RANK, MPI_LOCALNRANKS /
    PMI_LOCAL_SIZE, PMI_JOBID / PMI_KVSNAME / PALS_APID, I_MPI_*, and what
    :func:`unirank.launchers._mpi.build` reads.
    """
    if VARS.rank not in environ:  # PMI_SIZE alone is also a companion of PMIX_RANK
        return None
    return build(INTEL_NAME if is_intel(environ) else NAME, VARS, environ, ctx)


LAUNCHER = Launcher(NAME, detect, keys=(VARS.rank,), aliases=(INTEL_NAME,), srun_pmi=True)
