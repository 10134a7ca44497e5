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
    ``"lsf"``, ``"pbs"``, ``"kubeflow"``, ``"skypilot"`` or ``"local"``).

    ``master_addr`` and ``master_port`` are ``None`` only where neither the user nor the launcher
    gave enough to derive them (an MPI world spanning several nodes without ``MASTER_ADDR``);
    :meth:`require_master` turns that into a clear error. ``master_addr_given`` and
    ``master_port_given`` say whether ``MASTER_ADDR`` / ``MASTER_PORT`` gave them (rather than a
    launcher's host list, a job id, or the defaults ``127.0.0.1`` and 29500).

    ``hosts`` lists the job's nodes in node-rank order where the launcher names them;
    ``tasks_per_node`` how many of its processes the launcher placed on each of them, in the same
    order, where it says (Slurm: ``SLURM_STEP_TASKS_PER_NODE``, which may be uneven, ``2,1``).
    ``sources`` maps each field name to the environment variable(s) it came from, or to a short
    note (``"derived: ..."``, ``"default"``) when no variable gave it.

    ``launch_required`` is true for a Slurm allocation shell (``sbatch`` batch script or ``salloc``
    shell) where no task was launched: this process is alone, and ``planned_tasks`` is how many
    tasks the allocation holds. :attr:`must_launch` says whether the tasks must be started
    through ``srun`` first (see there), and :meth:`require_launched` is the one error for it.
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
    master_addr_given: bool = False
    master_port_given: bool = False
    job_id: str | None = None
    step_id: str | None = None
    node_name: str = ""
    hosts: tuple[str, ...] = ()
    tasks_per_node: tuple[int, ...] = ()
    launch_required: bool = False
    planned_tasks: int | None = None
    sources: Mapping[str, str] = field(default_factory=dict, compare=False, hash=False)

    @property
    def must_launch(self) -> bool:
        """True in a Slurm allocation shell holding more than one task (or node): going on alone
        would use a fraction of the allocation, and as one of N ranks it would wait forever, so
        the tasks must be started through ``srun`` (``unirank run`` does so itself). A shell
        holding one task runs in place, at world size 1."""
        return self.launch_required and max(self.planned_tasks or 1, self.num_nodes) > 1

    def require_launched(self, command: str) -> None:
        """Raise ConfigError, with ``command`` (the srun command to use) as its hint, when
        :attr:`must_launch`."""
        if self.must_launch:
            from unirank.errors import ConfigError
            from unirank.launchers.slurm_vars import STEP_ID

            tasks = f"{self.planned_tasks} tasks" if self.planned_tasks else \
                f"{self.num_nodes} nodes"
            raise ConfigError(
                f"this is a Slurm allocation shell (sbatch or salloc) holding {tasks}, but no "
                "task was launched",
                variable=STEP_ID[0],
                value=None,
                hint=f"start the tasks with: {command}",
            )

    @property
    def is_distributed(self) -> bool:
        """True when more than one process takes part."""
        return self.world_size > 1

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field but ``master_addr_given``/``master_port_given``
        (``sources`` says where the master came from)."""
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
            "tasks_per_node": list(self.tasks_per_node),
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

    def require_master(self, option: str | None = None) -> tuple[str, int]:
        """``(master_addr, master_port)``, or a ConfigError saying which variable to set.

        ``option`` names the planner's argument for the address (``master_addr``, the option
        ``--master-addr``), which the error then names instead of MASTER_ADDR.
        """
        from unirank.errors import ConfigError

        if self.master_addr is None:
            how = "export MASTER_ADDR=<first host of the job> (and MASTER_PORT) to every rank, " \
                "e.g. mpirun -x MASTER_ADDR=$(hostname) -x MASTER_PORT=29500"
            raise ConfigError(
                f"the {self.launcher} launcher does not name the master host of this "
                f"{self.num_nodes}-node world",
                variable=option or "MASTER_ADDR",
                value=None,
                hint=how if option is None else "pass --master-addr <first node's host name> (the "
                "same on every node), or export MASTER_ADDR to every task",
            )
        if self.master_port is None:
            raise ConfigError(
                f"the {self.launcher} launcher gives no port to derive one from",
                variable="MASTER_PORT",
                value=None,
                hint="export MASTER_PORT=<free port, same on every rank>",
            )
        return self.master_addr, self.master_port
