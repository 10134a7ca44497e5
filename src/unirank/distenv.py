"""The description of one process's place in a distributed job (:class:`DistEnv`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["DistEnv"]


@dataclass(frozen=True)
class DistEnv:
    """Where this process stands in a distributed job, as a launcher described it.

    ``launcher`` is the name of the launcher that was detected (``"torchrun"``, ``"slurm"``,
    ``"slurm-allocation"``, ``"openmpi"``, ``"mpich"``, ``"intelmpi"``, ``"mvapich"``, ``"pmix"``,
    ``"lsf"``, ``"pbs"``, ``"kubeflow"`` or ``"local"``).

    ``master_addr`` and ``master_port`` are ``None`` only where neither the user nor the launcher
    gave enough to derive them (an MPI world spanning several nodes without ``MASTER_ADDR``);
    :meth:`require_master` turns that into a clear error.

    ``hosts`` lists the job's nodes in node-rank order where the launcher names them.
    ``sources`` maps each field name to the environment variable(s) it came from, or to a short
    note (``"derived: ..."``, ``"default"``) when no variable gave it.

    ``launch_required`` is true for a Slurm allocation shell (``sbatch`` batch script or ``salloc``
    shell) where no task was launched: this process is alone, and ``planned_tasks`` is how many
    tasks the allocation holds. A job must go through ``srun`` (or ``unirank run``) from there.
    """

    launcher: str
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    node_rank: int = 0
    num_nodes: int = 1
    master_addr: str | None = "127.0.0.1"
    master_port: int | None = 29500
    job_id: str | None = None
    step_id: str | None = None
    node_name: str = ""
    hosts: tuple[str, ...] = ()
    launch_required: bool = False
    planned_tasks: int | None = None
    sources: Mapping[str, str] = field(default_factory=dict, compare=False, hash=False)

    @property
    def is_distributed(self) -> bool:
        """True when more than one process takes part."""
        return self.world_size > 1

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field."""
        return {
            "launcher": self.launcher,
            "rank": self.rank,
            "local_rank": self.local_rank,
            "world_size": self.world_size,
            "local_world_size": self.local_world_size,
            "node_rank": self.node_rank,
            "num_nodes": self.num_nodes,
            "master_addr": self.master_addr,
            "master_port": self.master_port,
            "job_id": self.job_id,
            "step_id": self.step_id,
            "node_name": self.node_name,
            "hosts": list(self.hosts),
            "launch_required": self.launch_required,
            "planned_tasks": self.planned_tasks,
            "sources": dict(self.sources),
        }

    def torchrun_environ(self) -> dict[str, str]:
        """The variables torchrun gives its workers, for this process.

        Raises :class:`~unirank.errors.ConfigError` when the master is unknown.
        """
        addr, port = self.require_master()
        return {
            "RANK": str(self.rank),
            "LOCAL_RANK": str(self.local_rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "GROUP_RANK": str(self.node_rank),
            "GROUP_WORLD_SIZE": str(self.num_nodes),
            "ROLE_RANK": str(self.rank),
            "ROLE_WORLD_SIZE": str(self.world_size),
            "ROLE_NAME": "default",
            "MASTER_ADDR": addr,
            "MASTER_PORT": str(port),
        }

    def require_master(self) -> tuple[str, int]:
        """``(master_addr, master_port)``, or a ConfigError saying which variable to set."""
        from unirank.errors import ConfigError

        if self.master_addr is None:
            raise ConfigError(
                f"the {self.launcher} launcher does not name the master host of this "
                f"{self.num_nodes}-node world",
                variable="MASTER_ADDR",
                value=None,
                hint="export MASTER_ADDR=<first host of the job> (and MASTER_PORT) "
                "to every rank, e.g. mpirun -x MASTER_ADDR=$(hostname) -x MASTER_PORT=29500",
            )
        if self.master_port is None:
            raise ConfigError(
                f"the {self.launcher} launcher gives no port to derive one from",
                variable="MASTER_PORT",
                value=None,
                hint="export MASTER_PORT=<free port, same on every rank>",
            )
        return self.master_addr, self.master_port
