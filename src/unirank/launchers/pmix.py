"""Ranks started by a PMIx server that exports nothing but ``PMIX_RANK`` and ``PMIX_NAMESPACE``.

PMIx publishes the job size and local ranks through its API, not the environment, and unirank
does not link libpmix. Launchers that set PMIX_RANK usually set their own variables too (Open
MPI's ``OMPI_COMM_WORLD_*``, Slurm's ``SLURM_*``), which are preferred; otherwise the size is taken
from ``PMI_SIZE`` or ``WORLD_SIZE``, and their absence is a ConfigError that says to set them.
"""

from __future__ import annotations

from collections.abc import Mapping

from unirank.distenv import DistEnv
from unirank.envvars import first_set
from unirank.errors import ConfigError
from unirank.launchers._base import Context, Launcher
from unirank.launchers._mpi import MpiVars, build

NAME = "pmix"


def detect(environ: Mapping[str, str], ctx: Context) -> DistEnv | None:
    """A PMIx rank, or None.

    Reads: PMIX_RANK, PMIX_NAMESPACE, PMI_SIZE / WORLD_SIZE, PMI_LOCAL_RANK / LOCAL_RANK,
    PMI_LOCAL_SIZE / LOCAL_WORLD_SIZE, and what :func:`unirank.launchers._mpi.build` reads.
    """
    if "PMIX_RANK" not in environ:
        return None
    size_var = first_set(environ, "PMI_SIZE", "WORLD_SIZE")
    if size_var is None:
        raise ConfigError(
            "is set but PMIx gives the world size only through its API",
            variable="PMIX_RANK", value=environ["PMIX_RANK"],
            hint="export WORLD_SIZE (and LOCAL_RANK, LOCAL_WORLD_SIZE) to every rank, or launch "
            "with srun --mpi=pmix or Open MPI's mpirun, which set their own variables",
        )
    names = MpiVars(
        rank="PMIX_RANK",
        size=size_var,
        local_rank=("PMI_LOCAL_RANK", "LOCAL_RANK"),
        local_size=("PMI_LOCAL_SIZE", "LOCAL_WORLD_SIZE"),
        job_id=("PMIX_NAMESPACE",),
    )
    return build(NAME, names, environ, ctx)


LAUNCHER = Launcher(NAME, detect, keys=("PMIX_RANK",), srun_pmi=True)
