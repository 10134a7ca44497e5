"""Planning ``unirank run``: from the options and the outer launcher to each worker's environment.

Everything here is pure: a :class:`RunRequest` (the command line), the outer :class:`DistEnv`
(who started ``unirank run``) and an environment mapping go in; a :class:`Plan` comes out, and
:meth:`Plan.worker_environ` gives the exact environment of one worker. Nothing here starts a
process, opens a socket or imports torch.

Layout rules:

* No outer launcher (``local``): one node unless ``--nnodes`` says otherwise. On one node the
  master is ``127.0.0.1`` and, unless a port is given (``--master-port`` or ``MASTER_PORT``), the
  supervisor picks a free one. Several nodes need ``--master-addr`` (or ``MASTER_ADDR``); the port
  then defaults to torch's 29500.
* Inside a launcher that started one ``unirank run`` per node (``srun --ntasks-per-node=1``,
  ``mpirun --map-by ppr:1:node``, ...): ``unirank run`` is the per-node launcher. The number of
  nodes, this node's rank and the master address and port come from the launcher's
  :class:`DistEnv` (Slurm: ``SLURM_NODEID``, the step's first node, the port from
  :func:`unirank.rendezvous.derive_port`).
* Command-line options override what the launcher says. ``--standalone`` means one node on its
  own, with a free port.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

from unirank.distenv import DistEnv
from unirank.errors import ConfigError
from unirank.rendezvous import DEFAULT_PORT, explicit_master

__all__ = [
    "DEFAULT_GRACE_PERIOD",
    "DEFAULT_INIT_TIMEOUT",
    "PRIVATE_VARIABLES",
    "Plan",
    "RunRequest",
    "make_plan",
    "parse_nnodes",
    "parse_nproc",
    "parse_seconds",
    "resolve_init_timeout",
]

DEFAULT_INIT_TIMEOUT = 300.0
DEFAULT_GRACE_PERIOD = 5.0

#: variables only the bootstrap reads; it removes them before the user's script starts
SUPERVISOR_PID_VAR = "UNIRANK_SUPERVISOR_PID"
STORE_FD_VAR = "UNIRANK_STORE_FD"
NODE_NAMES_VAR = "UNIRANK_NODE_NAMES"
NODE_NAME_VAR = "UNIRANK_NODE_NAME"
PRIVATE_VARIABLES = (SUPERVISOR_PID_VAR, STORE_FD_VAR, NODE_NAMES_VAR, NODE_NAME_VAR)

#: the user-facing init timeout, read by ``unirank run`` and passed on to the workers
INIT_TIMEOUT_VAR = "UNIRANK_INIT_TIMEOUT"

_NPROC_HINT = "use a positive integer, 'auto' (GPUs if any, else 1), 'gpu' or 'cpu'"


@dataclass(frozen=True)
class RunRequest:
    """What the user asked ``unirank run`` for (``None``: not given on the command line)."""

    nproc_per_node: int = 1
    nnodes: int | None = None
    node_rank: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    standalone: bool = False
    init_timeout: float = DEFAULT_INIT_TIMEOUT
    tag_output: bool = False
    grace_period: float = DEFAULT_GRACE_PERIOD


@dataclass(frozen=True)
class Plan:
    """The layout of one node's workers, and the rendezvous they share.

    ``master_port`` 0 means "not chosen yet": the supervisor binds a free port on this node (only
    possible with one node) and calls :meth:`with_port`.
    """

    nproc_per_node: int
    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int
    run_id: str
    node_name: str
    hosts: tuple[str, ...] = ()
    init_timeout: float = DEFAULT_INIT_TIMEOUT
    launcher: str = "local"

    @property
    def world_size(self) -> int:
        """Workers on all nodes together."""
        return self.nnodes * self.nproc_per_node

    @property
    def hosts_store(self) -> bool:
        """True on node 0, whose supervisor opens the rendezvous port before its workers start."""
        return self.node_rank == 0

    def global_rank(self, local_rank: int) -> int:
        """The global rank of this node's worker ``local_rank``."""
        return self.node_rank * self.nproc_per_node + local_rank

    def node_of(self, rank: int) -> str | None:
        """The name of the node that runs global ``rank``, where known."""
        node = rank // self.nproc_per_node
        if node == self.node_rank:
            return self.node_name
        if len(self.hosts) == self.nnodes and 0 <= node < self.nnodes:
            return self.hosts[node]
        return None

    def with_port(self, port: int) -> Plan:
        """This plan with the master port fixed (after the supervisor bound a free one)."""
        return replace(self, master_port=port)

    def dist_env(self, local_rank: int) -> DistEnv:
        """Worker ``local_rank``'s place in the world, as a :class:`DistEnv`."""
        return DistEnv(
            launcher="torchrun",
            rank=self.global_rank(local_rank),
            local_rank=local_rank,
            world_size=self.world_size,
            local_world_size=self.nproc_per_node,
            node_rank=self.node_rank,
            num_nodes=self.nnodes,
            master_addr=self.master_addr,
            master_port=self.master_port,
            node_name=self.node_name,
            hosts=self.hosts,
        )

    def worker_environ(
        self,
        local_rank: int,
        base: Mapping[str, str],
        *,
        supervisor_pid: int | None = None,
        tag_output: bool = False,
    ) -> dict[str, str]:
        """The whole environment of worker ``local_rank``: ``base`` plus torchrun's contract.

        Reads (from ``base``): OMP_NUM_THREADS, TORCH_NCCL_ASYNC_ERROR_HANDLING,
        PYTHONUNBUFFERED.

        Like torchrun: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,
        GROUP_WORLD_SIZE, ROLE_RANK, ROLE_WORLD_SIZE, ROLE_NAME, MASTER_ADDR, MASTER_PORT,
        TORCHELASTIC_RUN_ID, TORCHELASTIC_RESTART_COUNT=0, TORCHELASTIC_MAX_RESTARTS=0,
        TORCHELASTIC_USE_AGENT_STORE=True (node 0's supervisor hosts the store's port, so every
        rank is a store client), TORCH_NCCL_ASYNC_ERROR_HANDLING (kept, else 1) and
        OMP_NUM_THREADS=1 when unset and more than one worker shares the node. unirank adds
        UNIRANK_INIT_TIMEOUT, PYTHONUNBUFFERED=1 with ``tag_output`` (so tagged lines come out as
        they are printed) and, for the bootstrap only, the private UNIRANK_SUPERVISOR_PID,
        UNIRANK_NODE_NAME and UNIRANK_NODE_NAMES.
        """
        if self.master_port == 0:
            raise ValueError("the master port is not chosen yet: call Plan.with_port first")
        env = {k: v for k, v in base.items() if k not in PRIVATE_VARIABLES}
        env.update(self.dist_env(local_rank).torchrun_environ())
        env["TORCHELASTIC_RUN_ID"] = self.run_id
        env["TORCHELASTIC_RESTART_COUNT"] = "0"
        env["TORCHELASTIC_MAX_RESTARTS"] = "0"
        env["TORCHELASTIC_USE_AGENT_STORE"] = "True"
        env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = base.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
        if "OMP_NUM_THREADS" not in base and self.nproc_per_node > 1:
            env["OMP_NUM_THREADS"] = "1"
        if tag_output and "PYTHONUNBUFFERED" not in base:
            env["PYTHONUNBUFFERED"] = "1"
        env[INIT_TIMEOUT_VAR] = _format_seconds(self.init_timeout)
        env[NODE_NAME_VAR] = self.node_name
        if len(self.hosts) == self.nnodes:
            env[NODE_NAMES_VAR] = ",".join(self.hosts)
        if supervisor_pid is not None:
            env[SUPERVISOR_PID_VAR] = str(supervisor_pid)
        return env


def _format_seconds(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def parse_nproc(value: str, *, gpu_count: int, cpu_count: int | None) -> int:
    """``--nproc-per-node``: a positive integer, ``auto``, ``gpu`` or ``cpu``.

    ``auto`` is the number of GPUs when there are any, else 1; ``gpu`` is the number of GPUs (an
    error when there are none); ``cpu`` the number of CPUs.
    """
    text = value.strip().lower()
    if text == "auto":
        return gpu_count if gpu_count > 0 else 1
    if text == "gpu":
        if gpu_count <= 0:
            raise ConfigError(
                "asks for one worker per GPU, but no GPU is visible "
                "(CUDA_VISIBLE_DEVICES and /proc/driver/nvidia/gpus show none)",
                variable="--nproc-per-node", value=value,
                hint="give a number of workers, or 'cpu', or run where GPUs are visible",
            )
        return gpu_count
    if text == "cpu":
        return max(1, cpu_count or 1)
    try:
        count = int(text)
    except ValueError:
        raise ConfigError(
            "is not a number of workers", variable="--nproc-per-node", value=value,
            hint=_NPROC_HINT,
        ) from None
    if count < 1:
        raise ConfigError(
            "must be at least 1", variable="--nproc-per-node", value=value, hint=_NPROC_HINT
        )
    return count


def parse_nnodes(value: str) -> int:
    """``--nnodes``: a positive integer (torchrun's ``N:N`` is accepted; elastic ranges are not)."""
    text = value.strip()
    low, sep, high = text.partition(":")
    hint = "give the number of nodes as a positive integer; unirank run is not elastic"
    try:
        count = int(low)
        top = int(high) if sep else count
    except ValueError:
        raise ConfigError("is not a number of nodes", variable="--nnodes", value=value,
                          hint=hint) from None
    if count != top:
        raise ConfigError("is an elastic range, which unirank run does not support",
                          variable="--nnodes", value=value, hint=hint)
    if count < 1:
        raise ConfigError("must be at least 1", variable="--nnodes", value=value, hint=hint)
    return count


def parse_seconds(value: str, variable: str, *, allow_zero: bool = False) -> float:
    """A duration in seconds (a positive number, or zero when ``allow_zero``)."""
    least = "0 or more" if allow_zero else "more than 0"
    try:
        seconds = float(value.strip())
    except ValueError:
        raise ConfigError("is not a number of seconds", variable=variable, value=value,
                          hint=f"give a number of seconds, {least}") from None
    if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not allow_zero):
        raise ConfigError(f"must be a finite number of seconds, {least}", variable=variable,
                          value=value, hint=f"give a number of seconds, {least}")
    return seconds


def resolve_init_timeout(option: str | None, environ: Mapping[str, str]) -> float:
    """The init timeout: ``--init-timeout``, else UNIRANK_INIT_TIMEOUT, else 300 s.

    Reads: UNIRANK_INIT_TIMEOUT.
    """
    if option is not None:
        return parse_seconds(option, "--init-timeout")
    text = environ.get(INIT_TIMEOUT_VAR)
    if text is not None and text.strip():
        return parse_seconds(text, INIT_TIMEOUT_VAR)
    return DEFAULT_INIT_TIMEOUT


def _per_node_hint(outer: DistEnv) -> str:
    if outer.launcher.startswith("slurm"):
        return "start one unirank run per node: srun --ntasks-per-node=1 unirank run -n N ..."
    if outer.launcher in ("openmpi", "pmix"):
        return "start one unirank run per node: mpirun --map-by ppr:1:node unirank run -n N ..."
    if outer.launcher in ("mpich", "intelmpi", "mvapich"):
        return "start one unirank run per node: mpiexec -ppn 1 unirank run -n N ..."
    return "start unirank run once per node, or run the script directly without unirank run"


def make_plan(
    request: RunRequest,
    outer: DistEnv,
    environ: Mapping[str, str],
    *,
    hostname: str,
    run_id_fallback: str,
) -> Plan:
    """Lay out this node's workers (see the module docstring for the rules).

    ``outer`` is what :func:`unirank.launchers.detect` found around ``unirank run``;
    ``run_id_fallback`` becomes TORCHELASTIC_RUN_ID when the launcher gives no job id.

    Reads: MASTER_ADDR, MASTER_PORT (only without an outer launcher; a launcher's
    :class:`DistEnv` already accounts for them).
    """
    if request.nproc_per_node < 1:
        raise ConfigError("must be at least 1", variable="--nproc-per-node",
                          value=str(request.nproc_per_node), hint=_NPROC_HINT)
    if outer.launch_required:
        raise ConfigError(
            f"this is a {outer.launcher} shell where no task was launched",
            hint="start unirank run through srun --ntasks-per-node=1 (unirank run does so "
            "itself unless UNIRANK_NO_SRUN=1)",
        )
    node_name = outer.node_name or hostname
    per_node = outer.launcher != "local" and not request.standalone
    if per_node and outer.local_world_size > 1:
        raise ConfigError(
            f"unirank run was started {outer.local_world_size} times on this node by "
            f"{outer.launcher} (local world size {outer.local_world_size}); it starts the "
            "workers itself and must run once per node",
            hint=_per_node_hint(outer),
        )

    hosts: tuple[str, ...] = ()
    addr: str | None
    port: int | None
    if request.standalone:
        if request.nnodes not in (None, 1):
            raise ConfigError("--standalone runs on one node", variable="--nnodes",
                              value=str(request.nnodes), hint="drop --nnodes or --standalone")
        nnodes, node_rank = 1, 0
        addr = request.master_addr or "127.0.0.1"
        port = request.master_port or 0
    elif per_node:
        nnodes = request.nnodes if request.nnodes is not None else outer.num_nodes
        node_rank = request.node_rank if request.node_rank is not None else outer.node_rank
        addr = request.master_addr or outer.master_addr
        port = request.master_port or outer.master_port
        if len(outer.hosts) == nnodes:
            hosts = tuple(outer.hosts)
        if addr is None:
            raise ConfigError(
                f"the {outer.launcher} launcher does not name the master host of this "
                f"{nnodes}-node world",
                variable="--master-addr", value=None,
                hint="pass --master-addr <first node's host name> (the same on every node), "
                "or export MASTER_ADDR to every task",
            )
        if port is None:
            port = DEFAULT_PORT
    else:
        nnodes = request.nnodes if request.nnodes is not None else 1
        node_rank = request.node_rank if request.node_rank is not None else 0
        env_addr, env_port = explicit_master(environ)
        addr = request.master_addr or env_addr
        port = request.master_port or env_port
        if addr is None:
            if nnodes > 1:
                raise ConfigError(
                    f"is needed with --nnodes {nnodes}: the nodes must agree on the host of "
                    "rank 0",
                    variable="--master-addr", value=None,
                    hint="pass --master-addr <node 0's host name or address> on every node",
                )
            addr = "127.0.0.1"
        if port is None:
            port = 0 if nnodes == 1 else DEFAULT_PORT
        if nnodes == 1:
            hosts = (node_name,)

    if not 0 <= node_rank < nnodes:
        raise ConfigError(
            f"must be between 0 and {nnodes - 1} (there are {nnodes} nodes)",
            variable="--node-rank", value=str(node_rank),
            hint="give each node a distinct --node-rank from 0 to --nnodes - 1",
        )
    if port == 0 and node_rank != 0:  # pragma: no cover - nnodes == 1 implies node_rank == 0
        raise ConfigError("a free port can only be chosen on one node", variable="--master-port",
                          value="0", hint="pass --master-port <port> on every node")
    if outer.job_id and not request.standalone:
        run_id = outer.job_id if not outer.step_id else f"{outer.job_id}.{outer.step_id}"
    else:
        run_id = run_id_fallback
    return Plan(
        nproc_per_node=request.nproc_per_node,
        nnodes=nnodes,
        node_rank=node_rank,
        master_addr=addr,
        master_port=port,
        run_id=run_id,
        node_name=node_name,
        hosts=hosts,
        init_timeout=request.init_timeout,
        launcher=outer.launcher,
    )
